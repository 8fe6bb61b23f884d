"""loadtests/lifecycle.py: a signal stops the run wherever it lands. A newcomer's run
found Ctrl-C ignored: the handler raised `Interrupted` in whatever frame was running,
and when that was a fire-and-forget asyncio task (the open-loop generator's `send_one`)
the exception died with the task ("Task exception was never retrieved") and the run
went on to its end. The script below keeps such a task busy while its main coroutine
waits; the signal must end the run at once with 128 + the signal's number."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from loadtests import lifecycle
from tests.rigs.paths import ROOT

SCRIPT = """
import asyncio, sys
from loadtests import lifecycle

async def busy():
    n = 0
    while True:
        n += 1
        if n % 100_000 == 0:
            await asyncio.sleep(0)

async def scenario():
    keep = asyncio.get_running_loop().create_task(busy())  # fire and forget
    print("ready", flush=True)
    await asyncio.sleep(30)
    return keep

def main():
    asyncio.run(scenario())
    return 0

sys.exit(lifecycle.guarded(main, lambda: [], lambda: 0))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_landing_in_a_task_stops_the_run(signum: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        proc.send_signal(signum)
        proc.wait(timeout=20)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 128 + signum, err
    assert "stopped every process it started" in err
    assert "never retrieved" not in err
    # The scenario would have slept 30 s: the run ended because of the signal.
    assert took < 20


def test_a_load_phase_counts_down_on_the_progress_line() -> None:
    """A progress line during a load says how long the load has left, not only the last
    process started (a newcomer saw "sidecar started" 20 s into a 30 s load)."""
    lifecycle.note("load: 2 stream(s)", 30.0)
    line = lifecycle.progress_line()
    assert "load: 2 stream(s) (30 s left)" in line or "(29 s left)" in line
    lifecycle.note("scenario limits")
    assert "left" not in lifecycle.progress_line()

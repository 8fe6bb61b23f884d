"""loadtests/run.py stops every process it started on SIGTERM (what `timeout` and CI
send, to the runner alone) and on Ctrl-C (SIGINT to the terminal's whole process group:
the runner and its forked load children), prints progress lines while it runs, and
exits 1 whenever a verdict says FAIL (issue 29 item 7)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests import run as runner
from loadtests import scenarios
from tests.rigs.paths import ROOT
from tests.rigs.waiting import eventually_sync


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return ") Z " not in stat.read_text()
    except OSError:
        return False


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(proc.name))
    return found


def _mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(proc.name)):
            found.append(f"{proc.name}: {cmdline}")
    return found


def _started(out: Path) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = []
    for listing in out.glob("work-*/processes.json"):
        try:
            entries += json.loads(listing.read_text())
        except ValueError:  # being written
            return []
    return entries


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to the runner", "Ctrl-C to its process group"])
def test_a_signal_stops_every_process_the_run_started(tmp_path: Path, how: str) -> None:
    out = tmp_path / "out"
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [
                *(sys.executable, "loadtests/run.py", "noisy-neighbour", "--seconds", "120"),
                *("--scale", "0.1", "--progress", "0.5", "--out", str(out)),
            ],
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,  # its own group, as a terminal's foreground job
        )
    try:
        # Under load: the store and the sidecar listen, the load children are forked.
        started = eventually_sync(
            lambda: (
                [e for e in _started(out) if _listening(int(str(e["port"])))][:2]
                if len(_started(out)) >= 2
                else None
            ),
            within=60,
            what="the store and the sidecar listening",
        )
        forked = eventually_sync(
            lambda: [c for c in _children(proc.pid) if str(out) in _cmdline(c)],
            within=60,
            what="the load children forked",
        )
        eventually_sync(
            lambda: "running: " in err_path.read_text() and "sidecar" in err_path.read_text(),
            within=30,
            what="a progress line naming the running processes",
        )
        if how.startswith("SIGTERM"):
            proc.send_signal(signal.SIGTERM)
            expected = 128 + signal.SIGTERM
        else:
            os.killpg(proc.pid, signal.SIGINT)
            expected = 128 + signal.SIGINT
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        stdout = proc.stdout.read() if proc.stdout else ""
        if proc.stdout:
            proc.stdout.close()
    stderr = err_path.read_text()
    assert proc.returncode == expected, stdout + stderr
    assert "stopped every process the run started" in stderr
    for entry in _started(out):
        assert not _alive(int(str(entry["pid"]))), f"{entry} still running"
        assert not _listening(int(str(entry["port"]))), f"{entry} still listening"
    for pid in forked:
        assert not _alive(pid), f"load child {pid} still running"
    assert started
    assert _mentioning(str(out)) == []
    assert "Traceback" not in stderr, stderr


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture
def handlers() -> Iterator[None]:
    """run.main installs SIGTERM/SIGINT handlers: give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize(
    ("verdicts", "ok", "check", "status"),
    [
        ("quiet p99 with noisy / alone = 2.10 (target <= 2): FAIL", False, False, 1),
        ("quiet p99 with noisy / alone = 2.10 (target <= 2): FAIL", False, True, 1),
        ("quiet p99 with noisy / alone = 2.00 (target <= 2): PASS", True, False, 0),
        ("quiet p99 with noisy / alone = 2.00 (target <= 2): PASS", True, True, 0),
    ],
)
def test_a_fail_is_never_exit_0(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handlers: None,
    verdicts: str,
    ok: bool,
    check: bool,
    status: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(scenarios.SCENARIOS, "limits", lambda _out, _opts: (verdicts, ok))
    args = ["limits", "--out", str(tmp_path), *(["--check"] if check else [])]
    assert runner.main(args) == status
    assert verdicts in capsys.readouterr().out

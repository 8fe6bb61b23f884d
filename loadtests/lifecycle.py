"""A load run's signals and progress: SIGTERM and SIGINT stop every process the run
started, and a progress line goes to stderr at least every `PROGRESS_SECONDS`.

`install()` (in `run.py` and `bench.py`) makes SIGTERM (what `timeout`, CI and
Kubernetes send) and SIGINT (Ctrl-C) raise `Interrupted` in the run's own process:
the `with Stack(...)` blocks then stop their store, sidecars and helpers (SIGTERM, then
SIGKILL to each process group), `subprocess.run` kills its child (locust, `sidecar
quota reconcile`), and the load-generating children forked by `multiprocessing` get
SIGTERM at once (each exits straight away: a forked child inherits the handler, which
in any process but the run's own is an immediate exit). A second signal while all this
happens is noted, not obeyed: the cleanup is bounded (`stack.STOP_TIMEOUT` per process)
and must not be cut short, or the processes it is stopping would be orphaned.

`note(text)` records what the run is doing now; the progress thread prints it with
the elapsed time and the processes running.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

PROGRESS_SECONDS = 10.0


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the run; `signum` says which. A BaseException, so that
    no `except Exception` in a scenario swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _nothing() -> list[str]:
    return []


class _State:
    def __init__(self) -> None:
        self.owner = 0
        self.stopping = False
        self.started = time.monotonic()
        self.doing = "starting"
        self.running: Callable[[], list[str]] = _nothing


_state = _State()


def _handler(signum: int, _frame: FrameType | None) -> None:
    if os.getpid() != _state.owner:  # a forked load child: the run stops everything
        os._exit(128 + signum)
    if _state.stopping:
        print(
            f"loadtests: {signal.Signals(signum).name} again: still stopping what the run "
            "started (bounded; it will not be cut short)",
            file=sys.stderr,
            flush=True,
        )
        return
    _state.stopping = True
    stop_children()
    raise Interrupted(signum)


def install(running: Callable[[], list[str]] | None = None) -> None:
    """Handle SIGTERM and SIGINT in this process (the run's own). `running` lists the
    processes running now, for the progress line."""
    _state.owner = os.getpid()
    _state.stopping = False
    _state.started = time.monotonic()
    if running is not None:
        _state.running = running
    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)


def stop_children(grace: float = 5.0) -> int:
    """SIGTERM to every live `multiprocessing` child, SIGKILL to any still alive after
    `grace` seconds; returns how many there were."""
    children = multiprocessing.active_children()
    for child in children:
        if child.pid is not None:
            try:
                os.kill(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(1)
    return len(children)


def note(doing: str) -> None:
    """What the run does now (shown on the next progress line)."""
    _state.doing = doing


def progress_line() -> str:
    elapsed = time.monotonic() - _state.started
    running = _state.running()
    shown = ", ".join(running) if running else "none"
    return f"loadtests: {elapsed:.0f} s: {_state.doing}; running: {shown}"


class Progress:
    """A daemon thread printing `progress_line()` to stderr every `interval` seconds
    (at most `PROGRESS_SECONDS`) until stopped."""

    def __init__(self, interval: float = PROGRESS_SECONDS) -> None:
        self.interval = min(interval, PROGRESS_SECONDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            print(progress_line(), file=sys.stderr, flush=True)


def guarded(
    main: Callable[[], int], running: Callable[[], list[str]], sweep: Callable[[], int]
) -> int:
    """`main()` with the signals handled and progress lines printed; on a signal,
    `sweep()` (close what is still open) and 128 + the signal's number."""
    install(running)
    try:
        with Progress():
            return main()
    except Interrupted as stop:
        sweep()
        stop_children()
        print(f"{sys.argv[0]}: {stop}: stopped every process it started", file=sys.stderr)
        return 128 + stop.signum

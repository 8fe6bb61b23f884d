"""A load run's signals and progress: SIGTERM and SIGINT stop every process the run
started, and a progress line goes to stderr at least every `PROGRESS_SECONDS`.

`install()` (in `run.py` and `bench.py`) makes SIGTERM (what `timeout`, CI and
Kubernetes send) and SIGINT (Ctrl-C) raise `Interrupted` in the run's own process (or,
while an asyncio loop runs, cancel its every task: `asyncio.run` ends CancelledError):
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

import asyncio
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
        self.until: float | None = None  # when what the run does now ends (monotonic)
        self.signum = 0  # the signal that stopped the run (0: none yet)
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
    _state.signum = signum
    stop_children()
    # What is raised here lands in whatever frame runs now. In an asyncio task nobody
    # awaits (the open-loop generator's requests) an `Interrupted` would die with the
    # task and the run go on; so in a running loop every task is cancelled, the frame
    # running now included, and `asyncio.run` ends with CancelledError, which
    # `guarded` (and run.py) read as this signal.
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise Interrupted(signum) from None
    for task in asyncio.all_tasks(loop):
        task.cancel()
    raise asyncio.CancelledError(signal.Signals(signum).name)


# What a signal ends the run's main() with: `Interrupted`, or the CancelledError of an
# `asyncio.run` whose tasks the handler cancelled.
STOPPED = (Interrupted, asyncio.CancelledError)


def interrupted() -> int:
    """The signal that stopped the run (0: none)."""
    return _state.signum


def install(running: Callable[[], list[str]] | None = None) -> None:
    """Handle SIGTERM and SIGINT in this process (the run's own). `running` lists the
    processes running now, for the progress line."""
    _state.owner = os.getpid()
    _state.stopping = False
    _state.signum = 0
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


def note(doing: str, seconds_left: float | None = None) -> None:
    """What the run does now (shown on the next progress line); `seconds_left`: how long
    it will take from now (a load phase), counted down on the progress lines."""
    _state.doing = doing
    _state.until = None if seconds_left is None else time.monotonic() + seconds_left


def progress_line() -> str:
    elapsed = time.monotonic() - _state.started
    running = _state.running()
    shown = ", ".join(running) if running else "none"
    doing = _state.doing
    if _state.until is not None:
        doing += f" ({max(0.0, _state.until - time.monotonic()):.0f} s left)"
    return f"loadtests: {elapsed:.0f} s: {doing}; running: {shown}"


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
    except STOPPED:
        if not interrupted():
            raise  # a cancellation of the run's own, not a signal
        sweep()
        stop_children()
        name = signal.Signals(interrupted()).name
        print(f"{sys.argv[0]}: {name}: stopped every process it started", file=sys.stderr)
        return 128 + interrupted()

"""Start the backing store and the sidecar as processes on loopback, and stop them.

The one place that knows how: `sidecar demo`, the load tests (loadtests/stack.py) and
the test rigs (tests/rigs/processes.py) all call it.

- `free_port` picks a port nothing listens on. Anything else on the machine (an
  outgoing connection's ephemeral port, another test's server) can take it before the
  child binds it, so `start_on_free_ports` starts a child again on newly picked ports
  while it exits at start-up with "address already in use" (`BIND_ATTEMPTS` times).
- `start_store` / `start_sidecar` write the command line (and the sidecar's config
  file, `listen` set to the picked port), start the child in a session of its own
  (its output in a log file) and wait until it answers on `/healthz` (or
  `/readyz`): the wait ends at once when the child exits, and a child that never
  answers is killed, so a failed start leaves nothing running.
- `Process.stop` sends SIGTERM, waits, then SIGKILLs the child's process group (a
  sidecar with `--workers` forwards SIGTERM to its workers; SIGKILL takes them too).
- `ProcessGroup` stops everything started through it, last first, when its block
  ends, however it ends: a sidecar that fails to start never leaves its store behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

HOST = "127.0.0.1"
BIND_ATTEMPTS = 8
# How often a readiness wait asks again; the wait also returns the moment the child exits.
POLL_INTERVAL = 0.02
_IN_USE = "address already in use"


class StartError(RuntimeError):
    """A child did not become ready: it exited at start-up, or never answered (and was
    killed). The message carries its log."""


class AddressInUse(StartError):
    """The child exited at start-up because a port it was given was taken."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of asking."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Process:
    """One started child: its `Popen`, the port it serves on and its log file.

    `extra` holds what the starter wants to remember (the config path, a metrics port);
    `name` names it in messages; `config` is the sidecar's config file."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    config: Path | None = None
    # Where this child's output starts in `log_path` (the file may hold earlier runs').
    log_offset: int = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """The whole log file (this child's output and any earlier run's)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 3000) -> str:
        return self.log()[-n:]

    def own_log(self) -> str:
        """Only what this child wrote."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then after `timeout` seconds SIGKILL to its whole process group (it
        leads its own session, so forked workers go too); its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL to the child itself (not its group), and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def spawn(
    args: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """`args` in a session of its own, stdout and stderr appended to `log_path`; the
    environment is this one's without PYTHONWARNINGS (a child's warnings must not turn
    into errors), plus `env`."""
    full_env = dict(os.environ)
    full_env.pop("PYTHONWARNINGS", None)
    full_env.update(env or {})
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=None if cwd is None else str(cwd),
            env=full_env,
            start_new_session=True,
        )


def below_500(status: int) -> bool:
    """Any answer the server gives on its own (the default readiness test)."""
    return status < 500


def _answers(url: str, context: ssl.SSLContext | None, accept: Callable[[int], bool]) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as resp:
            return accept(resp.status)
    except urllib.error.HTTPError as exc:
        return accept(exc.code)
    except OSError:
        return False


def wait_ready(
    url: str,
    proc: Process,
    timeout: float = 15.0,
    context: ssl.SSLContext | None = None,
    accept: Callable[[int], bool] = below_500,
) -> None:
    """Until `url` answers with a status `accept` takes (over TLS trusting `context`).

    Ends at once when the child exits (`AddressInUse` when its log says a port was
    taken, else `StartError`); a child that has not answered after `timeout` seconds is
    killed (its group) and `StartError` raised. Interrupted while waiting (a signal
    handler raising, Ctrl-C), it stops the child before the exception goes on."""
    try:
        _wait_ready(url, proc, timeout, context, accept)
    except StartError:
        raise
    except BaseException:
        proc.stop(timeout=2)
        raise


def _wait_ready(
    url: str,
    proc: Process,
    timeout: float,
    context: ssl.SSLContext | None,
    accept: Callable[[int], bool],
) -> None:
    deadline = time.monotonic() + timeout
    while not (_answers(url, context, accept) and _listens(proc)):
        if time.monotonic() > deadline:
            proc.stop(timeout=0)
            raise StartError(f"{url} not ready after {timeout}s:\n{proc.log()}")
        try:
            proc.proc.wait(POLL_INTERVAL)  # returns the moment the child exits
        except subprocess.TimeoutExpired:
            continue
        own = proc.own_log()
        kind = AddressInUse if _IN_USE in own.lower() else StartError
        raise kind(f"{proc.name or url} exited with {proc.proc.returncode}:\n{proc.log()}")


def _listens(proc: Process) -> bool:
    """Whether the answer came from the child (or its workers): another process may take
    a port between its pick and the child's bind, and answer in its place. Read from
    /proc where there is one; elsewhere the answer is taken as the child's."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        return True
    inodes = set()
    for table in tables:
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if (
                len(cols) > 9
                and cols[3] == "0A"
                and int(cols[1].rsplit(":", 1)[1], 16) == proc.port
            ):
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return False
    pids = [proc.proc.pid]
    try:
        pids += [
            int(p)
            for p in Path(f"/proc/{proc.proc.pid}/task/{proc.proc.pid}/children")
            .read_text()
            .split()
        ]
    except OSError:
        pass
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    return True
            except OSError:
                continue
    return False


def start_on_free_ports(start: Callable[[], Process], picked: bool) -> Process:
    """`start()` (which picks its ports), again on new ports while the child finds a
    port taken; once only when the caller chose the ports (`picked` False)."""
    for attempt in range(BIND_ATTEMPTS if picked else 1):
        try:
            return start()
        except AddressInUse:
            if attempt == BIND_ATTEMPTS - 1 or not picked:
                raise
    raise AssertionError("unreachable")


def _started(
    args: Sequence[str],
    log_path: Path,
    port: int,
    name: str,
    env: Mapping[str, str] | None,
    cwd: Path | None,
) -> Process:
    offset = log_path.stat().st_size if log_path.exists() else 0
    popen = spawn(args, log_path, env, cwd)
    return Process(popen, port, log_path, name=name, log_offset=offset)


def start_command(
    name: str,
    args: Sequence[str],
    port: int,
    log_path: Path,
    ready_path: str | None = "/healthz",
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 15.0,
    accept: Callable[[int], bool] = below_500,
) -> Process:
    """Any server command already given its `port`; waits on `ready_path` unless None."""
    proc = _started(args, log_path, port, name, env, cwd)
    if ready_path is not None:
        wait_ready(proc.url + ready_path, proc, timeout, accept=accept)
    return proc


def store_command(port: int, db: Path, extra_args: Sequence[str] = ()) -> list[str]:
    """`python -m backing_store` on 127.0.0.1:`port` with its SQLite file `db`."""
    return [
        sys.executable,
        "-m",
        "backing_store",
        "--host",
        HOST,
        "--port",
        str(port),
        "--db",
        str(db),
        *extra_args,
    ]


def start_store(
    directory: Path,
    db: Path | None = None,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    *,
    name: str = "store",
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 15.0,
) -> Process:
    """The backing store on `port` (a free one, retried while taken, when None), its
    SQLite file `db` (default `directory/store.db`), its log `log_path` (default
    `directory/{name}-{port}.log`); returns once it answers `/healthz`."""
    db_file = db or directory / "store.db"

    def start() -> Process:
        chosen = port or free_port()
        log = log_path or directory / f"{name}-{chosen}.log"
        proc = _started(store_command(chosen, db_file, extra_args), log, chosen, name, env, cwd)
        proc.extra["db"] = db_file
        wait_ready(f"{proc.url}/healthz", proc, timeout)
        return proc

    return start_on_free_ports(start, picked=port is None)


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """The sidecar's YAML config file."""
    path.write_text(yaml.safe_dump(dict(config)))
    return path


def sidecar_command(
    config: Path, args: Sequence[str] = (), wrapper: Sequence[str] = ()
) -> list[str]:
    """`python [wrapper] -m sidecar.cli serve --config CONFIG [args]`."""
    return [
        sys.executable,
        *wrapper,
        "-m",
        "sidecar.cli",
        "serve",
        "--config",
        str(config),
        *args,
    ]


def start_sidecar(
    directory: Path,
    config: Mapping[str, Any],
    port: int | None = None,
    *,
    name: str = "sidecar",
    stem: str = "{name}-{port}",
    metrics: bool = False,
    args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    wait: bool = True,
    ready_path: str = "/healthz",
    accept: Callable[[int], bool] = below_500,
    tls: ssl.SSLContext | None = None,
    timeout: float = 15.0,
) -> Process:
    """`sidecar serve` with `config` (a dict) and `listen` set to `port` (a free one,
    retried while taken, when None).

    Its config file, log and (unless `config` names one) audit log are
    `directory/STEM.yaml`, `STEM.log` and `STEM-audit.log`, STEM being `stem` formatted
    with `name` and the port. `metrics`: also a `metricsListen` on a free port
    (`proc.extra["metrics_port"]`). `args`: more `serve` arguments; `wrapper`: Python
    arguments before `-m` (e.g. `-m cProfile -o FILE`). Waits until `ready_path`
    answers a status `accept` takes, over HTTPS trusting `tls` when given; with
    `wait=False` nothing waits (and a taken port is not retried)."""

    def start() -> Process:
        chosen = port or free_port()
        settings = dict(config)
        settings["listen"] = f"{HOST}:{chosen}"
        extra: dict[str, Any] = {}
        if metrics:
            extra["metrics_port"] = free_port()
            settings["metricsListen"] = f"{HOST}:{extra['metrics_port']}"
        file_stem = stem.format(name=name, port=chosen)
        settings.setdefault("audit", {"path": str(directory / f"{file_stem}-audit.log")})
        path = write_config(directory / f"{file_stem}.yaml", settings)
        command = sidecar_command(path, args, wrapper)
        proc = _started(command, directory / f"{file_stem}.log", chosen, name, env, cwd)
        proc.config = path
        proc.extra.update({"config": path, **extra})
        if wait:
            scheme = "https" if tls is not None else "http"
            url = f"{scheme}://{HOST}:{chosen}{ready_path}"
            wait_ready(url, proc, timeout, context=tls, accept=accept)
        return proc

    return start_on_free_ports(start, picked=port is None and wait)


@dataclass
class ProcessGroup:
    """Processes stopped together, last started first: by `stop_all`, and when a `with`
    block over the group ends (normally or not)."""

    started: list[Process] = field(default_factory=list)
    # SIGTERM, then after this many seconds SIGKILL (see `Process.stop`).
    stop_timeout: float = 10.0

    def add(self, proc: Process) -> Process:
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        while self.started:
            self.started.pop().stop(self.stop_timeout)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

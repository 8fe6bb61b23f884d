"""Start the real backing store and the real sidecar as processes on loopback.

Integration tests use these helpers; each process gets a free random port on
127.0.0.1 and is stopped (SIGTERM, then SIGKILL) when the test ends.

A port picked free can be taken by anything else on the machine (an outgoing
connection's ephemeral port, another test's server) before the child binds it. So a
child that exits at start-up because its address is in use is started again on
newly picked ports (`BIND_ATTEMPTS` times): the one place where tests start processes
never fails on that race.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.rigs.paths import ROOT
from tests.rigs.waiting import eventually_sync

BIND_ATTEMPTS = 8
_IN_USE = "address already in use"


class AddressInUse(RuntimeError):
    """The child exited at start-up because a port it was given was taken."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def _spawn(
    args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    full_env = dict(os.environ)
    full_env.pop("PYTHONWARNINGS", None)
    full_env.update(env or {})
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
            env=full_env,
            start_new_session=True,
        )


def wait_http(
    url: str, proc: Proc, timeout: float = 15.0, context: ssl.SSLContext | None = None
) -> None:
    """Until `url` answers below 500 (over TLS with `context`); fails at once if the
    process exits, and kills it if it never answers."""

    def answers() -> bool:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.proc.returncode}:\n{proc.log()}")
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as resp:
                return bool(resp.status < 500)
        except urllib.error.HTTPError as exc:
            return exc.code < 500
        except OSError:
            return False

    try:
        eventually_sync(answers, timeout, what=f"{url} answers")
    except AssertionError:
        proc.kill()
        raise RuntimeError(f"{url} not ready after {timeout}s:\n{proc.log()}") from None
    except RuntimeError:
        if _IN_USE in proc.log().lower():
            raise AddressInUse(proc.log()) from None
        raise


def start_on_free_ports(start: Callable[[], Proc], picked: bool) -> Proc:
    """`start()` (which picks its ports), again on new ports while the child finds a
    port taken; once only when the caller chose the ports (`picked` False)."""
    for attempt in range(BIND_ATTEMPTS if picked else 1):
        try:
            return start()
        except AddressInUse:
            if attempt == BIND_ATTEMPTS - 1 or not picked:
                raise
    raise AssertionError("unreachable")


def start_store(
    tmp: Path, db: Path | None = None, port: int | None = None, extra_args: list[str] | None = None
) -> Proc:
    """`python -m backing_store` on a free port with its SQLite file in `tmp`."""
    db_file = db or (tmp / "store.db")

    def start() -> Proc:
        chosen = port or free_port()
        log_path = tmp / f"store-{chosen}.log"
        args = [
            sys.executable,
            "-m",
            "backing_store",
            "--host",
            "127.0.0.1",
            "--port",
            str(chosen),
            "--db",
            str(db_file),
            *(extra_args or []),
        ]
        proc = Proc(_spawn(args, log_path), chosen, log_path, {"db": db_file})
        wait_http(f"{proc.url}/healthz", proc)
        return proc

    return start_on_free_ports(start, picked=port is None)


def write_config(tmp: Path, config: dict[str, Any], name: str = "sidecar.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(config))
    return path


def start_sidecar(
    tmp: Path,
    config: dict[str, Any],
    port: int | None = None,
    env: dict[str, str] | None = None,
    wait: bool = True,
    name: str = "sidecar",
    metrics: bool = False,
    tls: ssl.SSLContext | None = None,
) -> Proc:
    """`python -m sidecar.cli serve --config …` with `listen` set to a free port.

    `config` is the YAML config as a dict; defaults that would touch the working
    directory (ledger, policies) should be given by the caller. `metrics`: also a
    `metricsListen` on a free port (`proc.extra["metrics_port"]`). `tls`: wait for
    the listener over HTTPS, trusting this context. With `wait=False` nothing waits
    (and a taken port is not retried)."""

    def start() -> Proc:
        chosen = port or free_port()
        settings = dict(config)
        settings["listen"] = f"127.0.0.1:{chosen}"
        extra: dict[str, Any] = {}
        if metrics:
            extra["metrics_port"] = free_port()
            settings["metricsListen"] = f"127.0.0.1:{extra['metrics_port']}"
        settings.setdefault("ledger", f"sqlite:///{tmp / 'ledger.db'}")
        settings.setdefault("audit", {"path": str(tmp / f"{name}-{chosen}-audit.log")})
        path = write_config(tmp, settings, f"{name}-{chosen}.yaml")
        log_path = tmp / f"{name}-{chosen}.log"
        args = [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path)]
        proc = Proc(_spawn(args, log_path, env), chosen, log_path, {"config": path, **extra})
        if wait:
            scheme = "https" if tls is not None else "http"
            wait_http(f"{scheme}://127.0.0.1:{chosen}/healthz", proc, context=tls)
        return proc

    return start_on_free_ports(start, picked=port is None and wait)


def write_tokens(tmp: Path, tokens: list[dict[str, Any]], name: str = "tokens.yaml") -> Path:
    """A static token file: [{token, user, tenant, groups}]."""
    path = tmp / name
    path.write_text(yaml.safe_dump(tokens))
    return path


@dataclass
class Processes:
    """Every process a test started, stopped when it ends (the `procs` fixture)."""

    tmp: Path
    started: list[Proc] = field(default_factory=list)

    def store(self, **kwargs: Any) -> Proc:
        proc = start_store(self.tmp, **kwargs)
        self.started.append(proc)
        return proc

    def sidecar(self, config: dict[str, Any], **kwargs: Any) -> Proc:
        proc = start_sidecar(self.tmp, config, **kwargs)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()

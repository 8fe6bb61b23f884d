"""Start the real backing store and the real sidecar as processes on loopback.

Integration tests use these helpers; each process gets a free random port on
127.0.0.1 and is stopped (SIGTERM, then SIGKILL) when the test ends. How to start,
wait for and stop them (and retry on new ports when a picked port is taken before
the child binds it) is `sidecar/cli/launch.py`'s; this module gives it the tests'
defaults: the repository as working directory, files in the test's `tmp`, a SQLite
ledger and an audit log in `tmp` for every sidecar.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sidecar.cli import launch
from sidecar.cli.launch import BIND_ATTEMPTS, AddressInUse, free_port, start_on_free_ports
from tests.rigs.paths import ROOT

__all__ = [
    "BIND_ATTEMPTS",
    "AddressInUse",
    "Proc",
    "Processes",
    "free_port",
    "start_on_free_ports",
    "start_sidecar",
    "start_store",
    "wait_http",
    "write_config",
    "write_tokens",
]

Proc = launch.Process


def _spawn(
    args: list[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`args` started from the repository, output appended to `log_path`."""
    return launch.spawn(args, log_path, env, cwd=ROOT)


def wait_http(
    url: str, proc: Proc, timeout: float = 15.0, context: ssl.SSLContext | None = None
) -> None:
    """Until `url` answers below 500 (over TLS with `context`); fails at once if the
    process exits, and kills it if it never answers."""
    launch.wait_ready(url, proc, timeout, context)


def start_store(
    tmp: Path, db: Path | None = None, port: int | None = None, extra_args: list[str] | None = None
) -> Proc:
    """`python -m backing_store` on a free port with its SQLite file in `tmp`."""
    return launch.start_store(tmp, db, port, extra_args or (), cwd=ROOT)


def write_config(tmp: Path, config: dict[str, Any], name: str = "sidecar.yaml") -> Path:
    return launch.write_config(tmp / name, config)


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

    settings = dict(config)
    settings.setdefault("ledger", f"sqlite:///{tmp / 'ledger.db'}")
    # Following the policy objects stored through the API (DESIGN §5) is opt-in here:
    # many tests put a fake upstream (no store) behind the sidecar and count what it
    # receives. Tests of that feature, and the kubectl cluster, give `apiPolicy`.
    settings.setdefault("apiPolicy", {"enabled": False})
    return launch.start_sidecar(
        tmp, settings, port, name=name, metrics=metrics, env=env, cwd=ROOT, wait=wait, tls=tls
    )


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

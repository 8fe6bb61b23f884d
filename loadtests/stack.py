"""Start and stop what a load run needs: the backing store and sidecar processes.

Every process is started in its own session on a free 127.0.0.1 port, tracked in a
`Stack`, and stopped when the stack closes (SIGTERM, then SIGKILL to the process
group it leads). The stack also writes the scenario's policy directory and token
file into its work directory and seeds tenants/namespaces/objects straight into the
store. `processes.json` in the work directory lists every pid and port started, so a
test can check that nothing outlived the run.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadtests import lifecycle
from sidecar.cli import launch
from sidecar.cli.launch import free_port as free_port  # the loadtests' name for it

ROOT = Path(__file__).resolve().parent.parent

Proc = launch.Process
# Stop: SIGTERM, then after this many seconds SIGKILL to the process group.
STOP_TIMEOUT = 8.0
READY_TIMEOUT = 20.0


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, Any]:
    """A small blocking JSON call (setup and checks, never the load itself)."""
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        status = exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def _ok(status: int) -> bool:
    return status == 200


def _env() -> dict[str, str]:
    """The children import this checkout's packages (and `loadtests`)."""
    return {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@dataclass
class Stack:
    """The processes of one run, under one work directory (started through
    `sidecar.cli.launch`)."""

    work: Path
    procs: list[Proc] = field(default_factory=list)
    started: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        OPEN.append(self)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _track(self, proc: Proc) -> Proc:
        lifecycle.note(f"{proc.name or 'a process'} started (pid {proc.pid}, port {proc.port})")
        self.procs.append(proc)
        self.started.append({"name": proc.name, "pid": proc.pid, "port": proc.port})
        (self.work / "processes.json").write_text(json.dumps(self.started, indent=1))
        return proc

    def start_store(self, name: str = "store") -> Proc:
        return self._track(
            launch.start_store(
                self.work,
                self.work / f"{name}.db",
                name=name,
                log_path=self.work / f"{name}.log",
                env=_env(),
                cwd=ROOT,
                timeout=READY_TIMEOUT,
            )
        )

    def start_sidecar(
        self,
        config: dict[str, Any],
        name: str = "sidecar",
        workers: int = 1,
        wrapper: list[str] | None = None,
    ) -> Proc:
        """`sidecar serve --config` on a free port, ready once `/readyz` answers 200;
        `wrapper` prefixes the python command line (e.g. `-m cProfile -o FILE`)."""
        cfg = dict(config)
        limits = dict(cfg.get("limits") or {})
        limits.setdefault("shutdownGraceSeconds", 1)
        cfg["limits"] = limits
        args = ["--log-level", "WARNING"]
        if workers > 1:
            args += ["--workers", str(workers)]
        return self._track(
            launch.start_sidecar(
                self.work,
                cfg,
                name=name,
                stem="{name}",
                args=args,
                wrapper=wrapper or (),
                env=_env(),
                cwd=ROOT,
                ready_path="/readyz",
                accept=_ok,
                timeout=READY_TIMEOUT,
            )
        )

    def start_command(
        self, name: str, args: list[str], port: int, ready_path: str | None = "/healthz"
    ) -> Proc:
        return self._track(
            launch.start_command(
                name,
                args,
                port,
                self.work / f"{name}.log",
                ready_path,
                env=_env(),
                cwd=ROOT,
                timeout=READY_TIMEOUT,
                accept=_ok,
            )
        )

    def write_policies(self, docs: list[dict[str, Any]], name: str = "policies") -> Path:
        directory = self.work / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "scenario.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return directory

    def write_tokens(self, tokens: list[dict[str, Any]]) -> Path:
        path = self.work / "tokens.yaml"
        path.write_text(yaml.safe_dump(tokens))
        return path

    def close(self) -> None:
        if self.procs:
            lifecycle.note(f"stopping {len(self.procs)} process(es) of {self.work.name}")
        for proc in reversed(self.procs):
            proc.stop(STOP_TIMEOUT)
        self.procs.clear()
        OPEN[:] = [s for s in OPEN if s is not self]


# Every stack not closed yet (for the progress line and a last sweep on a signal).
OPEN: list[Stack] = []


def running() -> list[str]:
    """The processes of the open stacks still running, as `name (pid, :port)`."""
    return [
        f"{p.name or 'process'} (pid {p.pid}, :{p.port})"
        for stack in OPEN
        for p in stack.procs
        if p.proc.poll() is None
    ]


def close_all() -> int:
    """Close every open stack (a run stopped by a signal); how many processes it had."""
    count = 0
    for stack in list(OPEN):
        count += len(stack.procs)
        stack.close()
    return count


def seed_tenant(store_url: str, tenant: str, namespace: str = "dev") -> None:
    """Create a tenant and a namespace straight in the store (no sidecar, no quota)."""
    status, body = http("POST", f"{store_url}/api/v1/tenants", {"metadata": {"name": tenant}})
    if status not in (201, 409):
        raise RuntimeError(f"seeding tenant {tenant}: {status} {body}")
    status, body = http(
        "POST", f"{store_url}/api/v1/tenants/{tenant}/namespaces", {"metadata": {"name": namespace}}
    )
    if status not in (201, 409):
        raise RuntimeError(f"seeding namespace {tenant}/{namespace}: {status} {body}")


def servers_path(tenant: str, namespace: str = "dev") -> str:
    return f"/apis/compute/v1/tenants/{tenant}/namespaces/{namespace}/servers"


def seed_server(store_url: str, tenant: str, name: str, namespace: str = "dev") -> None:
    status, body = http(
        "POST",
        store_url + servers_path(tenant, namespace),
        {"metadata": {"name": name}, "spec": {"flavor": "m1.small"}},
    )
    if status not in (201, 409):
        raise RuntimeError(f"seeding server {tenant}/{name}: {status} {body}")


def count_servers(store_url: str, tenant: str, namespace: str = "dev") -> int:
    status, body = http("GET", store_url + servers_path(tenant, namespace))
    if status != 200 or not isinstance(body, dict):
        raise RuntimeError(f"counting servers of {tenant}: {status} {body}")
    return len(body.get("items") or [])


def member_policies(tenants: list[str]) -> list[dict[str, Any]]:
    """A realistic tenant policy: a `member` ClusterRole bound per tenant."""
    docs: list[dict[str, Any]] = [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "member"},
            "rules": [
                {
                    "apiGroups": ["", "apps", "batch"],
                    "resources": ["pods", "services", "configmaps", "deployments", "jobs"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {
                    "apiGroups": ["compute"],
                    "resources": ["servers", "servers/tags"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {
                    "apiGroups": ["container"],
                    "resources": ["bays"],
                    "verbs": ["get", "list", "create", "delete"],
                },
            ],
        }
    ]
    for tenant in tenants:
        docs.append(
            {
                "kind": "TenantRoleBinding",
                "metadata": {"name": "members", "tenant": tenant},
                "roleRef": {"kind": "ClusterRole", "name": "member"},
                "subjects": [{"kind": "Group", "name": "members"}],
            }
        )
    return docs


def tokens_for(tenants: list[str]) -> list[dict[str, Any]]:
    return [
        {"token": f"token-{t}", "user": f"user-{t}", "tenant": t, "groups": ["members"]}
        for t in tenants
    ]


def rate_limit_doc(
    tenant: str,
    rate: float,
    burst: int,
    max_in_flight: int = 256,
) -> dict[str, Any]:
    name = "default" if tenant == "*" else tenant
    return {
        "kind": "RateLimit",
        "metadata": {"name": name},
        "spec": {"tenant": tenant, "rate": rate, "burst": burst, "maxInFlight": max_in_flight},
    }

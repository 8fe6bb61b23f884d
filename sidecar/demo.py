"""`sidecar demo`: the backing store and the sidecar on free local ports, with the
shipped `policies/`, demo credentials and seed data, until Ctrl-C.

Everything the demo writes (token file, config, SQLite files, logs) lives in one
temporary directory that is removed when the demo stops.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

# Demo credentials: static tokens (identity.tokenFile). The groups match the
# bindings in the shipped policies/: alice administers acme and owns its nodes,
# dave administers beta, admin is a cluster admin.
DEMO_TOKENS = [
    {"token": "demo-admin", "user": "admin", "tenant": "system", "groups": ["cluster-admins"]},
    {
        "token": "demo-alice",
        "user": "alice",
        "tenant": "acme",
        "groups": ["tenant-admins", "node-owners"],
    },
    {"token": "demo-dave", "user": "dave", "tenant": "beta", "groups": ["tenant-admins"]},
]

SEED: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/api/v1/tenants", {"metadata": {"name": "acme"}}),
    ("POST", "/api/v1/tenants", {"metadata": {"name": "beta"}}),
    (
        "POST",
        "/apis/compute/v1/tenants/acme/namespaces/default/servers",
        {"metadata": {"name": "web-1"}, "tags": ["prod", "web"], "spec": {"flavor": "m1.small"}},
    ),
    (
        "POST",
        "/apis/compute/v1/tenants/acme/namespaces/default/servers",
        {"metadata": {"name": "db-1"}, "tags": ["prod", "db"], "spec": {"flavor": "m1.large"}},
    ),
    (
        "POST",
        "/apis/compute/v1/tenants/beta/namespaces/default/servers",
        {"metadata": {"name": "api-1"}, "tags": ["staging"], "spec": {"flavor": "m1.small"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-a1"}, "spec": {"owner": "acme", "resource_class": "bm-small"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-a2"}, "spec": {"owner": "acme", "resource_class": "bm-large"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-b1"}, "spec": {"owner": "beta", "resource_class": "bm-small"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-free"}, "spec": {"owner": None, "resource_class": "bm-small"}},
    ),
]


def run(args: argparse.Namespace) -> int:
    policies = Path(args.policies or "policies").resolve()
    if not policies.is_dir():
        print(f"sidecar demo: no policy directory at {policies}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        store_port, sidecar_port = _free_port(), _free_port()
        (work / "tokens.yaml").write_text(yaml.safe_dump(DEMO_TOKENS))
        config = {
            "listen": f"127.0.0.1:{sidecar_port}",
            "upstream": f"http://127.0.0.1:{store_port}",
            "policies": str(policies),
            "identity": {"tokenFile": str(work / "tokens.yaml")},
            "ledger": f"sqlite:///{work / 'ledger.db'}",
            "audit": {"path": str(work / "audit.log")},
        }
        (work / "sidecar.yaml").write_text(yaml.safe_dump(config))
        procs.append(
            _spawn(
                [
                    sys.executable,
                    "-m",
                    "backing_store",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(store_port),
                    "--db",
                    str(work / "store.db"),
                ],
                work / "store.log",
            )
        )
        _wait(f"http://127.0.0.1:{store_port}/healthz", procs[-1], work / "store.log")
        procs.append(
            _spawn(
                [
                    sys.executable,
                    "-m",
                    "sidecar.cli",
                    "serve",
                    "--config",
                    str(work / "sidecar.yaml"),
                ],
                work / "sidecar.log",
            )
        )
        base = f"http://127.0.0.1:{sidecar_port}"
        _wait(f"{base}/healthz", procs[-1], work / "sidecar.log")
        for method, path, body in SEED:
            status = _call(base, method, path, body, "demo-admin")
            if status >= 300 and status != 409:
                print(f"sidecar demo: seeding {method} {path} answered {status}", file=sys.stderr)
        _print_banner(base, work)
        _wait_for_stop(args.seconds, procs)
        return 0
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(work, ignore_errors=True)
        print("demo stopped: backing store and sidecar are down, temporary files removed.")


def _print_banner(base: str, work: Path) -> None:
    alice = "-H 'Authorization: Bearer demo-alice'"
    dave = "-H 'Authorization: Bearer demo-dave'"
    admin = "-H 'Authorization: Bearer demo-admin'"
    servers = "/apis/compute/v1/tenants/{t}/namespaces/default/servers"
    lines = [
        "",
        f"sidecar demo: sidecar on {base} (files in {work}). Try:",
        "",
        "# alice (tenant acme) lists her servers, and those tagged prod:",
        f"curl -s {alice} {base}{servers.format(t='acme')}",
        f"curl -s {alice} '{base}{servers.format(t='acme')}?tags=prod'",
        "# alice creates a server (counted against acme's quota):",
        f"curl -s {alice} -X POST -H 'Content-Type: application/json' "
        f'-d \'{{"metadata":{{"name":"web-2"}},"tags":["new"]}}\' '
        f"{base}{servers.format(t='acme')}",
        "# alice tries tenant beta: 404, exactly as if beta did not exist:",
        f"curl -s {alice} {base}{servers.format(t='beta')}",
        "# alice lists nodes: only the ones acme owns (owner rule):",
        f"curl -s {alice} {base}/api/v1/nodes",
        "# alice reads acme's quota:",
        f"curl -s {alice} {base}/quota/v1/tenants/acme",
        "# dave (tenant beta) with the short path (his own tenant):",
        f"curl -s {dave} {base}/apis/compute/v1/namespaces/default/servers",
        "# the cluster admin sees every tenant's servers and every node:",
        f"curl -s {admin} {base}/apis/compute/v1/servers",
        f"curl -s {admin} {base}/api/v1/nodes",
        f"curl -s {admin} {base}/quota/v1/quotas",
        "# no credentials: 401",
        f"curl -s {base}/api/v1/nodes",
        "# readiness needs no credentials; metrics name every tenant (operators only):",
        f"curl -s {base}/readyz",
        f"curl -s {admin} {base}/metrics | grep sidecar_requests_total",
        "",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def _wait_for_stop(seconds: float, procs: list[subprocess.Popen[bytes]]) -> None:
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    deadline = time.monotonic() + seconds if seconds > 0 else None
    while not stop.is_set():
        if deadline is not None and time.monotonic() >= deadline:
            break
        if any(p.poll() is not None for p in procs):
            print("sidecar demo: a process stopped unexpectedly", file=sys.stderr)
            break
        stop.wait(0.2)


def _call(base: str, method: str, path: str, body: Any, token: str) -> int:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sidecar demo: {proc.args!r} exited:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"sidecar demo: {url} did not come up:\n{log.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

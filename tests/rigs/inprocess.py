"""The in-process rig: the real sidecar app (`build_app`) served by aiohttp's TestServer
on a random 127.0.0.1 port, and a recording upstream; no subprocess.

- `RecordingUpstream`: an in-process aiohttp server on a random 127.0.0.1 port that
  records every request it receives (method, path, headers) and answers 200.
- `running_sidecar`: the real sidecar app served in-process, forwarding to a given
  upstream, with a test policy directory (`TEST_POLICY` unless the config names one).
- `status_body`: asserts a Kubernetes Failure Status and returns it.

Tests reach these through the `recording_upstream` and `inprocess_sidecar` fixtures of
tests/conftest.py (or import them when they need the context managers directly).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.app import build_app
from sidecar.config.settings import load_config

# Each tenant's users get everything inside their own tenant through a
# TenantRoleBinding; system operators get everything through a ClusterRoleBinding.
TEST_POLICY = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["*"]
---
kind: TenantRoleBinding
metadata: {name: users-everything, tenant: acme}
roleRef: {kind: ClusterRole, name: everything}
subjects:
- {kind: Group, name: users}
---
kind: TenantRoleBinding
metadata: {name: users-everything, tenant: beta}
roleRef: {kind: ClusterRole, name: everything}
subjects:
- {kind: Group, name: users}
---
kind: ClusterRoleBinding
metadata: {name: operators-everything}
roleRef: {kind: ClusterRole, name: everything}
subjects:
- {kind: Group, name: operators, tenant: system}
"""


# What the `inprocess_sidecar` fixture gives: (upstream URL, config overrides) → the
# running app's base URL, as an async context manager.
InProcessSidecar = Callable[..., AbstractAsyncContextManager[str]]


@dataclass
class Seen:
    method: str
    path: str
    headers: list[tuple[str, str]]

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def one(self, name: str) -> str | None:
        values = self.all(name)
        assert len(values) <= 1, f"{name} sent {len(values)} times: {values}"
        return values[0] if values else None


@dataclass
class RecordingUpstream:
    seen: list[Seen] = field(default_factory=list)
    server: TestServer | None = None

    @property
    def forwarded(self) -> list[Seen]:
        """Client requests the sidecar forwarded (its own calls, e.g. quota recounts,
        carry no X-Forwarded-For)."""
        return [s for s in self.seen if s.all("X-Forwarded-For")]

    def touching(self, tenant: str) -> list[Seen]:
        """Every request, forwarded or the sidecar's own, that names `tenant`."""
        return [s for s in self.seen if f"/tenants/{tenant}" in s.path]

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.seen.append(Seen(request.method, request.raw_path, list(request.headers.items())))
        # A resourceVersion as a real store's answers carry (a charged update's real
        # write holds the dry run's version: issue 28).
        return web.json_response(
            {"kind": "Recorded", "path": request.raw_path, "metadata": {"resourceVersion": "1"}}
        )


@asynccontextmanager
async def recording_upstream() -> AsyncIterator[RecordingUpstream]:
    rec = RecordingUpstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", rec.handle)
    rec.server = TestServer(app, host="127.0.0.1")
    await rec.server.start_server()
    try:
        yield rec
    finally:
        await rec.server.close()


def write_policy(tmp: Path) -> Path:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "test.yaml").write_text(TEST_POLICY)
    return policies


@asynccontextmanager
async def running_sidecar(
    tmp: Path, upstream: str, overrides: dict[str, Any] | None = None
) -> AsyncIterator[str]:
    """The real sidecar app on a random loopback port; yields its base URL."""
    base: dict[str, Any] = {
        "upstream": upstream,
        "policies": str(write_policy(tmp)),
        "ledger": f"sqlite:///{tmp / 'ledger.db'}",
        "audit.path": str(tmp / "audit.log"),
        "reload.enabled": False,
    }
    base.update(overrides or {})
    config = load_config(None, env={}, overrides=base)
    app = build_app(config)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def status_body(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)
    assert body["kind"] == "Status", body
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    return dict(body)

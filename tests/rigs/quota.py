"""The real store and the real sidecar processes the quota tests (and the quota attack
tests of tests/security/) run against: `quota_env` with tenant acme, its policy, and
helpers to read what the store holds and what the quota API says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from tests.rigs import processes
from tests.rigs.policies import admin_policy

QUOTA_POLICY = admin_policy('servers: 10, requests.cpu: "4", requests.memory: 8Gi')
ADMIN = {"Authorization": "Bearer admin-token"}
ALICE = {"Authorization": "Bearer alice-token"}
STORE_HEADERS = {"X-Remote-User": "test", "X-Remote-Tenant": "system"}
NS = "/tenants/acme/namespaces/default"
SERVERS = f"/apis/compute/v1{NS}/servers"
PODS = f"/api/v1{NS}/pods"
CONFIGMAPS = f"/api/v1{NS}/configmaps"
DEPLOYMENTS = f"/apis/apps/v1{NS}/deployments"


class Gate:
    """A pass-through to the real store that holds chosen requests until released."""

    def __init__(self, store_url: str, hold: Callable[[web.Request], bool]) -> None:
        self.store_url = store_url
        self.hold = hold
        self.open = asyncio.Event()
        self.held = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if self.hold(request):
            self.held.set()
            await self.open.wait()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("content-type", "x-remote-user", "x-remote-tenant", "x-remote-group")
        }
        target = URL(self.store_url + request.raw_path, encoded=True)
        async with (
            aiohttp.ClientSession() as http,
            http.request(request.method, target, data=body or None, headers=headers) as resp,
        ):
            return web.Response(
                status=resp.status, body=await resp.read(), content_type="application/json"
            )


@dataclass
class QuotaEnv:
    http: aiohttp.ClientSession
    store: processes.Proc
    sidecar: processes.Proc
    ledger_url: str
    tmp: Path

    def url(self, path: str) -> str:
        return self.sidecar.url + path

    async def send(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        data = (
            body
            if isinstance(body, bytes)
            else (None if body is None else json.dumps(body).encode())
        )
        hdrs = {**ALICE, "Content-Type": content_type, **(headers or {})}
        async with self.http.request(method, self.url(path), data=data, headers=hdrs) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def stored(self, path: str) -> Any:
        """The object (or list) as the real store has it, read directly."""
        async with self.http.get(self.store.url + path, headers=STORE_HEADERS) as r:
            return (await r.json()) if r.status == 200 else None

    async def usage(self, resource: str) -> tuple[Any, Any]:
        """(used, in_progress) of the tenant acme, from the quota API."""
        async with self.http.get(self.url("/quota/v1/tenants/acme"), headers=ADMIN) as r:
            assert r.status == 200, await r.text()
            rows = {q["resource"]: q for q in (await r.json())["quotas"]}
        row = rows.get(resource, {"used": 0, "in_progress": 0})
        return row["used"], row["in_progress"]


@asynccontextmanager
async def quota_env(
    tmp: Path,
    ledger_url: str,
    upstream: str | None = None,
    store: processes.Proc | None = None,
    policy: str = QUOTA_POLICY,
    **extra: Any,
) -> AsyncIterator[QuotaEnv]:
    """The real store (unless given), the real sidecar in front of it (or of
    `upstream`), and tenant acme created."""
    own_store = store is None
    store = store or processes.start_store(tmp)
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(policy)
    tokens = processes.write_tokens(
        tmp,
        [
            {"token": "admin-token", "user": "admin", "tenant": "system", "groups": []},
            {"token": "alice-token", "user": "alice", "tenant": "acme", "groups": []},
        ],
    )
    config: dict[str, Any] = {
        "upstream": upstream or store.url,
        "policies": str(policies),
        "ledger": ledger_url,
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
        "limits": {"upstreamReadTimeout": 30},
    }
    config.update(extra)
    try:
        sidecar = processes.start_sidecar(tmp, config)
    except BaseException:
        if own_store:
            store.stop()  # a sidecar that fails to start leaves no store behind
        raise
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            env = QuotaEnv(http, store, sidecar, ledger_url, tmp)
            status, body = await env.send(
                "POST", "/api/v1/tenants", {"metadata": {"name": "acme"}}, headers=ADMIN
            )
            assert status in (200, 201), body
            yield env
    finally:
        sidecar.stop()
        if own_store:
            store.stop()


def pod(name: str, cpu: str = "", memory: str = "") -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": requests}}]},
    }


def deployment(name: str, replicas: int, cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}
                    ]
                }
            },
        },
    }

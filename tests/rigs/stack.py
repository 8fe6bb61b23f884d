"""A running stack for tests that need the whole product: the real backing store and the
real sidecar as processes, tenants acme and beta with a namespace ns1 each, static tokens
for admin (system), alice (acme) and bob (beta), and a quota of `limit` configmaps and
servers per tenant. Reached through `running_env` (or the `stack` fixture in
tests/conftest.py, limit 5)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.cli.launch import ProcessGroup
from tests.rigs import processes
from tests.rigs.policies import admin_policy

POLICY = admin_policy(
    'configmaps: LIMIT, servers: LIMIT, requests.cpu: "1"', {"acme": "alice", "beta": "bob"}
)
TOKENS = [
    {"token": "admin-token", "user": "admin", "tenant": "system", "groups": []},
    {"token": "alice-token", "user": "alice", "tenant": "acme", "groups": []},
    {"token": "bob-token", "user": "bob", "tenant": "beta", "groups": []},
]
ADMIN, ALICE, BOB = "admin-token", "alice-token", "bob-token"
CONFIGMAPS = "/api/v1/namespaces/ns1/configmaps"


@dataclass
class Env:
    """The real store and the real sidecar in front of it, tenants acme and beta with a
    namespace ns1 each, and a quota of `limit` configmaps and servers per tenant."""

    url: str
    store: processes.Proc
    http: aiohttp.ClientSession
    sidecar: processes.Proc

    @property
    def store_url(self) -> str:
        return self.store.url

    def stop_store(self) -> None:
        self.store.stop()

    async def call(
        self,
        token: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {token}", **(headers or {})}
        data: bytes | None = None
        if isinstance(body, bytes):
            data = body
        elif body is not None:
            data = json.dumps(body).encode()
            content_type = content_type or "application/json"
        if content_type:
            sent["Content-Type"] = content_type
        async with self.http.request(method, self.url + path, data=data, headers=sent) as resp:
            raw = await resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw

    async def used(self, tenant: str, resource: str) -> tuple[str, str]:
        """(used, in_progress) of one resource in a tenant, from the quota API."""
        status, body = await self.call(ADMIN, "GET", f"/quota/v1/tenants/{tenant}/usage")
        assert status == 200, body
        row = body["usage"].get(resource, {"used": 0, "in_progress": 0})
        return str(row["used"]), str(row["in_progress"])

    async def stored(self, tenant: str, path: str) -> list[str]:
        """Names the store holds (asked directly, as a system caller, by tenant path)."""
        headers = {"X-Remote-User": "test", "X-Remote-Tenant": "system"}
        url = f"{self.store_url}/api/v1/tenants/{tenant}/{path}"
        async with self.http.get(url, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return [item["metadata"]["name"] for item in (await resp.json())["items"]]


def write_policies(tmp: Path, limit: int) -> Path:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(POLICY.replace("LIMIT", str(limit)))
    return policies


def sidecar_config(tmp: Path, upstream: str, limit: int, **extra: Any) -> dict[str, Any]:
    tokens = processes.write_tokens(tmp, TOKENS)
    config: dict[str, Any] = {
        "upstream": upstream,
        "policies": str(write_policies(tmp, limit)),
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
    }
    config.update(extra)
    return config


async def seed(env: Env) -> None:
    for tenant in ("acme", "beta"):
        status, body = await env.call(
            ADMIN, "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
        )
        assert status == 201, body
        status, body = await env.call(
            ADMIN, "POST", f"/api/v1/tenants/{tenant}/namespaces", {"metadata": {"name": "ns1"}}
        )
        assert status == 201, body


@asynccontextmanager
async def running_env(
    tmp: Path, limit: int, env: dict[str, str] | None = None, metrics: bool = False, **extra: Any
) -> AsyncIterator[Env]:
    """`extra`: more sidecar config keys; `env`: the sidecar's environment additions;
    `metrics`: also a `metricsListen` (`env.sidecar.extra["metrics_port"]`)."""
    with ProcessGroup() as started:  # stops both however the block ends (a failed start too)
        store = started.add(processes.start_store(tmp))
        config = sidecar_config(tmp, store.url, limit, **extra)
        sidecar = started.add(processes.start_sidecar(tmp, config, env=env, metrics=metrics))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            running = Env(sidecar.url, store, http, sidecar)
            await seed(running)
            yield running

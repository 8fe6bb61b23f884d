"""Shared set-up for the tenancy attack tests: the real backing store and the real
sidecar as processes, with the shipped policies (or a test policy directory), a static
token file for every role the attacks need, and a recording pass-through in front of
the store so a test can assert what the upstream received."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from tests.rigs import paths, processes

SHIPPED_POLICIES = paths.SHIPPED_POLICIES

# token → identity. The shipped policies bind: `admin` (system) cluster-wide,
# `tenant-admins` of acme and beta per tenant, acme's `node-owners` and `developers`.
TOKENS = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "acme-admin", "user": "alice", "tenant": "acme", "groups": ["tenant-admins"]},
    {"token": "beta-admin", "user": "bert", "tenant": "beta", "groups": ["tenant-admins"]},
    {"token": "acme-owner", "user": "oscar", "tenant": "acme", "groups": ["node-owners"]},
    {"token": "acme-dev", "user": "dave", "tenant": "acme", "groups": ["developers"]},
    {"token": "beta-user", "user": "bob", "tenant": "beta", "groups": ["pod-owners"]},
    {"token": "acme-user", "user": "amy", "tenant": "acme", "groups": ["pod-owners"]},
]


@dataclass
class Recorder:
    """A pass-through to the store that records every request's method and raw path
    (`seen`), and the headers it came with (`headers`, one list per request)."""

    store_url: str
    seen: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""
    headers: list[list[tuple[str, str]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.raw_path))
        self.headers.append(list(request.headers.items()))
        body = await request.read()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower()
            in (
                "content-type",
                "accept",
                "x-remote-user",
                "x-remote-tenant",
                "x-remote-group",
                "authorization",
            )
        }
        target = URL(self.store_url + request.raw_path, encoded=True)
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            async with http.request(
                request.method, target, data=body or None, headers=headers
            ) as resp:
                data = await resp.read()
                return web.Response(
                    status=resp.status,
                    body=data,
                    headers={"Content-Type": resp.headers.get("Content-Type", "application/json")},
                )


@dataclass
class Env:
    url: str
    recorder: Recorder
    http: aiohttp.ClientSession
    sidecar: processes.Proc

    async def call(
        self,
        token: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One request with `path` sent exactly as written (no normalisation)."""
        data = None if body is None else json.dumps(body).encode()
        return await self.call_raw(token, method, path, data, content_type)

    async def call_raw(
        self,
        token: str,
        method: str,
        path: str,
        data: bytes | None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """`call` with the body's bytes as given (YAML, protobuf, …)."""
        headers = {"Authorization": f"Bearer {token}"}
        if data is not None:
            headers["Content-Type"] = content_type
        url = URL(self.url + path, encoded=True)
        async with self.http.request(method, url, data=data, headers=headers) as resp:
            raw = await resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw

    def upstream_saw(self, fragment: str) -> list[tuple[str, str]]:
        return [s for s in self.recorder.seen if fragment in s[1]]


@asynccontextmanager
async def running(
    tmp: Path, policies: Path = SHIPPED_POLICIES, metrics: bool = False, **config: Any
) -> AsyncIterator[Env]:
    """The store, the recorder in front of it, and the sidecar pointed at the recorder.
    `metrics`: also a `metricsListen` (`env.sidecar.extra["metrics_port"]`)."""
    store = processes.start_store(tmp)
    recorder = Recorder(store.url)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    recorder.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    tokens = processes.write_tokens(tmp, TOKENS)
    settings: dict[str, Any] = {
        "upstream": recorder.url,
        "policies": str(policies),
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
        **config,
    }
    sidecar = None
    try:
        sidecar = await _start_sidecar(tmp, settings, metrics)
        async with aiohttp.ClientSession() as http:
            yield Env(sidecar.url, recorder, http, sidecar)
    finally:
        if sidecar is not None:
            sidecar.stop()
        await runner.cleanup()
        store.stop()


async def _start_sidecar(tmp: Path, settings: dict[str, Any], metrics: bool) -> processes.Proc:
    """Start the sidecar without blocking the event loop the recorder runs on."""
    import asyncio

    return await asyncio.to_thread(processes.start_sidecar, tmp, settings, metrics=metrics)


async def seed(
    env: Env,
    nodes: dict[str, str | None],
    tenants: tuple[str, ...] = ("acme", "beta"),
) -> None:
    """Create tenants and nodes (name → owner, None for an unowned node) as the admin."""
    for tenant in tenants:
        status, body = await env.call(
            "admin", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
        )
        assert status == 201, body
    for name, owner in nodes.items():
        spec: dict[str, Any] = {"resource_class": "gpu"}
        if owner:
            spec["owner"] = owner
        status, body = await env.call(
            "admin", "POST", "/api/v1/nodes", {"metadata": {"name": name}, "spec": spec}
        )
        assert status == 201, body

"""A deterministic interleaving rig: a pass-through between the sidecar and the real
store that runs a chosen step (`before`) just before it forwards a request it picks
(`picks`), e.g. a write injected between the sidecar's dry run of an update and the
real update, or (`after`) once the store answered it and before the answer goes back. Nothing is timed: the injected step has landed before the picked request
reaches the store, on every run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

_FORWARDED = ("content-type", "x-remote-user", "x-remote-tenant", "x-remote-group")


def real_delete(path: str) -> Callable[[web.Request], bool]:
    """Picks the real (not `dryRun`) DELETE of the object at `path`."""

    def picks(request: web.Request) -> bool:
        return request.method == "DELETE" and request.path == path and "dryRun" not in request.query

    return picks


def real_write(path: str) -> Callable[[web.Request], bool]:
    """Picks the real (not `dryRun`) PUT/PATCH of the object at `path` itself."""

    def picks(request: web.Request) -> bool:
        return (
            request.method in ("PUT", "PATCH")
            and request.path == path
            and "dryRun" not in request.query
        )

    return picks


class Interleaver:
    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self.picks: Callable[[web.Request], bool] = lambda _r: False
        self.before: Callable[[web.Request], Awaitable[None]] | None = None
        # Run once the store answered a picked request, before its answer goes back.
        self.after: Callable[[web.Request], Awaitable[None]] | None = None
        self.picked = 0  # picked requests forwarded so far
        self.seen: list[tuple[str, str, bytes]] = []  # (method, path with query, body)
        self._http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        body = await request.read()
        self.seen.append((request.method, request.raw_path, body))
        picked = self.picks(request)
        if picked:
            self.picked += 1
            if self.before is not None:
                await self.before(request)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() in _FORWARDED]
        target = URL(self.store_url + request.raw_path, encoded=True)
        async with self._http.request(
            request.method, target, data=body or None, headers=headers
        ) as resp:
            answer = await resp.read()
            status, ctype = resp.status, resp.headers.get("Content-Type", "application/json")
        if picked and self.after is not None:
            await self.after(request)
        return web.Response(status=status, body=answer, headers={"Content-Type": ctype})

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        """Serve on a free port of 127.0.0.1; yields its URL."""
        server = TestServer(self.app(), host="127.0.0.1")
        await server.start_server()
        async with aiohttp.ClientSession() as http:
            self._http = http
            try:
                yield str(server.make_url("")).rstrip("/")
            finally:
                self._http = None
                await server.close()

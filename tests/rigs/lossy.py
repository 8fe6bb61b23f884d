"""A relay in front of the real backing store that loses the answers of chosen requests
after the store has acted on them, as a network or an upstream that fails between the
write and the answer does (DESIGN §7, "an outcome the sidecar did not see").

`lose(request)` picks, per request, one of:
- `None`: passed through untouched;
- `"drop"`: forwarded to the store, then the connection is cut before any answer;
- `"500"`: forwarded to the store, then answered 500 whatever the store said;
- `"hold"`: forwarded to the store, then its answer is held until `release` is set (the
  sidecar's read timeout runs out first: a 504);
- `"stall"`: never forwarded; held until `release` is set, then cut (nothing created);
- `"late"`: held until `release` is set, then forwarded to the store and its answer
  passed on (an upstream still working on a write the sidecar has given up on: the
  store makes the object after the sidecar's settling reads found nothing).

Everything else (the sidecar's settling reads included) reaches the store as sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

Loss = str | None
_PASSED = ("content-type", "accept", "x-remote-user", "x-remote-tenant", "x-remote-group")


class LossyRelay:
    def __init__(self, store_url: str, lose: Callable[[web.Request], Loss]) -> None:
        self.store_url = store_url
        self.lose = lose
        self.release = asyncio.Event()
        self.acted = 0  # requests the store acted on whose answer was lost
        self.seen: list[tuple[str, str]] = []  # (method, path) of every request
        self.lost = asyncio.Event()  # set at the first lost answer
        self.held = 0  # requests held ("stall", "late") so far
        self._late: set[asyncio.Task[tuple[int, bytes, str]]] = set()
        self._server: TestServer | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return str(self._server.make_url("")).rstrip("/")

    async def __aenter__(self) -> LossyRelay:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._http = aiohttp.ClientSession()
        self._server = TestServer(app, host="127.0.0.1")
        await self._server.start_server()
        return self

    async def __aexit__(self, *_: object) -> None:
        self.release.set()
        if self._late:
            await asyncio.wait(set(self._late), timeout=10)
        if self._server is not None:
            await self._server.close()
        if self._http is not None:
            await self._http.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.path))
        loss = self.lose(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() in _PASSED}
        forward = self._forward(request.method, request.raw_path, body, headers)
        if loss == "late":
            # The write goes on when the sidecar has gone away (which cancels this
            # handler): an upstream that finishes what it started.
            self.held += 1
            self.lost.set()
            late = asyncio.ensure_future(self._after_release(forward))
            self._late.add(late)
            late.add_done_callback(self._late.discard)
            status, answer, ctype = await asyncio.shield(late)
            return web.Response(status=status, body=answer, headers={"Content-Type": ctype})
        if loss == "stall":
            forward.close()
            self.held += 1
            self.lost.set()
            await self.release.wait()
            _cut(request)
            return web.Response(status=500)
        status, answer, ctype = await forward
        if loss is None:
            return web.Response(status=status, body=answer, headers={"Content-Type": ctype})
        self.acted += 1
        self.lost.set()
        if loss == "hold":
            await self.release.wait()
        elif loss == "drop":
            _cut(request)
        elif loss == "500":
            return web.json_response(
                {"kind": "Status", "code": 500, "message": "lost after the write"}, status=500
            )
        return web.Response(status=status, body=answer, headers={"Content-Type": ctype})

    async def _forward(
        self, method: str, raw_path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes, str]:
        assert self._http is not None
        target = URL(self.store_url + raw_path, encoded=True)
        async with self._http.request(method, target, data=body or None, headers=headers) as resp:
            return (
                resp.status,
                await resp.read(),
                resp.headers.get("Content-Type", "application/json"),
            )

    async def _after_release(
        self, forward: Coroutine[Any, Any, tuple[int, bytes, str]]
    ) -> tuple[int, bytes, str]:
        await self.release.wait()
        answer = await forward
        self.acted += 1
        return answer


def _cut(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()

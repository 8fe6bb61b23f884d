"""An upstream that records how it READ each request it received: a real aiohttp server
(its own thread and event loop) that parses every forwarded target exactly as the
backing store does (`backing_store.app.read_target`: the path by the shared grammar,
the query as aiohttp/yarl decode it, `request.query`), keyed by `X-Request-Id`.

The differential tests compare this reading with the sidecar's own (DESIGN §1, §8): a
request the sidecar forwarded must read the same on both sides."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from backing_store.app import read_target
from sidecar.core.target import RequestTarget, TargetError

# The parts of a reading both sides must agree on.
Reading = tuple[Any, ...]
PARAMS = ("watch", "fieldSelector", "labelSelector", "dryRun", "owner")


def reading_of(target: RequestTarget) -> Reading:
    """What a reader acts on: the verb, where, what, and the parameters that matter."""
    return (
        target.verb,
        target.tenant,
        target.namespace,
        target.api_group,
        target.resource,
        target.subresource,
        target.name,
        target.extra,
        tuple(target.param(p) for p in PARAMS),
    )


@dataclass
class Received:
    method: str
    raw_path: str
    reading: Reading | None  # None: the upstream could not read it (its 400)
    error: str = ""


class UpstreamReader:
    """Answers every request `200 {}` (a watch: one empty chunked answer) and records
    its reading under the request's `X-Request-Id`."""

    def __init__(self) -> None:
        self.received: dict[str, list[Received]] = {}
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UpstreamReader:
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        if self._runner is not None:
            self._call(self._runner.cleanup())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(10)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        try:
            target = read_target(request)
            resolved = target.resolve_tenant(request.headers.get("X-Remote-Tenant", ""))
            seen = Received(request.method, request.raw_path, reading_of(resolved))
        except TargetError as exc:
            seen = Received(request.method, request.raw_path, None, exc.message)
        self.received.setdefault(request.headers.get("X-Request-Id", ""), []).append(seen)
        return web.json_response({})

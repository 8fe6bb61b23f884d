"""Watches at the upstream (DESIGN §6): a pool of their own, released when the client
leaves.

- Watches use an upstream pool of their own (`limits.upstreamWatchPoolSize`), so
  however many watches are open, ordinary requests (`limits.upstreamPoolSize`) always
  find a connection. When every watch connection is taken the next watch is answered
  503 with `Retry-After` at once; it never waits for one. (Each tenant's share is
  capped by `maxWatches` in the rate-limit stage.)
- A watch may sit for minutes without an event, and aiohttp tells a handler nothing
  when its client disconnects unless `handler_cancellation` is on. That switch stays
  off: it would cancel every handler at whatever await it is in, cutting quota
  commits, releases and audit records short after the upstream already acted.
  Instead only the forwarding of a watch runs as a task of its own, and one shared
  poller looks at the open watches' client connections every `POLL_SECONDS`. When a
  client is gone its task is cancelled, which closes the upstream connection (an
  unfinished response is never put back in the pool), and the handler ends as for
  any client that went away.
- `close_all()` ends every open watch at once (SIGTERM: the clients re-watch).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from sidecar.context import RequestContext
from sidecar.errors import StatusError

POLL_SECONDS = 0.25
Forward = Callable[[RequestContext], Coroutine[Any, Any, web.StreamResponse]]
RelayTask = asyncio.Task[web.StreamResponse]


def client_gone(request: web.BaseRequest) -> bool:
    """Whether the request's client connection is closed (or closing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


class WatchRelay:
    """The open watches of this process: how many, and whose clients are still there."""

    def __init__(self, pool_size: int, poll_seconds: float = POLL_SECONDS) -> None:
        self.pool_size = pool_size
        self.poll_seconds = poll_seconds
        self.open: dict[RelayTask, web.BaseRequest] = {}
        self._ended: set[RelayTask] = set()
        self._poller: asyncio.Task[None] | None = None

    async def run(self, ctx: RequestContext, forward: Forward) -> web.StreamResponse:
        """`forward(ctx)` for a watch, ended early if its client goes away."""
        if len(self.open) >= self.pool_size:
            raise StatusError(
                503,
                f"all {self.pool_size} upstream connections for watches are in use; retry shortly",
                headers={"Retry-After": "1"},
            )
        task: RelayTask = asyncio.create_task(forward(ctx))
        self.open[task] = ctx.request
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task not in self._ended or (current is not None and current.cancelling()):
                raise
            raise ConnectionResetError("the client of this watch went away") from None
        finally:
            self.open.pop(task, None)
            self._ended.discard(task)
            if not task.done():
                task.add_done_callback(_retrieve)

    def close_all(self) -> None:
        """End every open watch now: cut its client and close its upstream connection."""
        for task, request in list(self.open.items()):
            transport = request.transport
            if transport is not None:
                transport.abort()
            self._end(task)

    def _end(self, task: RelayTask) -> None:
        self._ended.add(task)
        task.cancel()

    async def _poll(self) -> None:
        # No await between the emptiness check and returning, so a watch that `run`
        # adds is always seen by this poller or starts a new one.
        while self.open:
            await asyncio.sleep(self.poll_seconds)
            for task, request in list(self.open.items()):
                if not task.done() and task not in self._ended and client_gone(request):
                    self._end(task)


def _retrieve(task: RelayTask) -> None:
    with contextlib.suppress(BaseException):
        task.exception()

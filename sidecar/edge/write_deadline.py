"""A deadline on every write to a client (DESIGN §8; `limits.clientWriteTimeout`).

A client that reads nothing of what waits for it for `limits.clientWriteTimeout`
(default 60 s) loses its connection. Without this, a client that stops reading holds
whatever is writing to it for as long as it likes: aiohttp's `write` waits for the
socket to drain with no deadline, so an owner-filtered list, a Table or any streamed
answer kept its upstream connection and its tenant's in-flight slot, and a whole
answer its memory (a hostile review held 64 store connections with 64 stalled readers
and locked the tenant out with 429s).

How, at no cost on the fast path (no timer or task per request or per write): the
transport tells its protocol when its write buffer goes above its high-water mark
(`pause_writing`) and back below the low-water mark (`resume_writing`), and aiohttp's
`write` only ever waits in between. `DeadlineHandler` (aiohttp's `RequestHandler`, that
protocol) reports both to the server's one `WriteDeadlines`. While any connection is
paused, one sweeper task looks at the paused ones every `tick` (a quarter of the
timeout, at most a second): a buffer that shrank means the client read something, and
its clock starts again; one that has not shrunk for the timeout is aborted. The abort
wakes the waiting write, the next write fails (the transport is closed), and the
request unwinds as for any client that went away (the relay of sidecar/edge/watches.py
also sees the closed connection within its poll): the upstream connection is closed,
the in-flight slot freed, a quota reservation settled, the audit line written (499).

This covers every answer, whoever writes it and whenever: owner-filtered lists and
Tables as they stream, proxied streams, the sidecar's own answers, and whole answers
aiohttp writes after the handler returned, and a connection closing with more than the
high-water mark of its answer still unread (its buffer is dropped).

Watches keep their own rules (lifetime, policy, credential: DESIGN §5, edge/watches.py)
while they have nothing to send: an idle watch is not a blocked one. A watch whose
client reads nothing while events wait for it is cut by the same deadline, as the
Kubernetes API server drops a watcher that does not keep up; its client watches again.

Served by `sidecar serve` (`edge.server.FrontDoorRunner`); the in-process test path
(aiohttp's own `AppRunner`) has no deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("sidecar.clients")

MAX_TICK_SECONDS = 1.0


class _Paused:
    """A connection whose write buffer is above its high-water mark."""

    __slots__ = ("since", "size", "transport")

    def __init__(self, transport: asyncio.WriteTransport, now: float) -> None:
        self.transport = transport
        self.size = transport.get_write_buffer_size()
        self.since = now  # when the client last read something (or the pause began)


class WriteDeadlines:
    """The connections of one server whose client is not keeping up, and the sweeper
    that cuts those that read nothing for `timeout` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.tick = min(MAX_TICK_SECONDS, timeout / 4)
        self.paused: dict[object, _Paused] = {}
        self.cut = 0  # connections cut, for the log and tests
        self._sweeper: asyncio.Task[None] | None = None

    def pause(self, key: object, transport: asyncio.WriteTransport) -> None:
        """`key`'s transport went above its high-water mark: its clock starts."""
        loop = asyncio.get_running_loop()
        self.paused[key] = _Paused(transport, loop.time())
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep(), name="client-write-deadlines")

    def resume(self, key: object) -> None:
        """`key`'s transport drained below its low-water mark (or its connection ended)."""
        self.paused.pop(key, None)

    def sweep(self, now: float) -> None:
        """One look at the paused connections at loop time `now`."""
        for key, paused in list(self.paused.items()):
            size = paused.transport.get_write_buffer_size()
            if size < paused.size:  # the client read something
                paused.since = now
            paused.size = size
            if now - paused.since >= self.timeout:
                del self.paused[key]
                self.cut += 1
                peer = paused.transport.get_extra_info("peername")
                log.info(
                    "a client read nothing of its answer for %.0f s "
                    "(limits.clientWriteTimeout): connection from %s cut",
                    now - paused.since,
                    peer[0] if isinstance(peer, tuple) and peer else "?",
                )
                paused.transport.abort()

    async def _sweep(self) -> None:
        # No await between finding nothing paused and returning, so a pause recorded
        # meanwhile is always seen by this task or starts a new one.
        loop = asyncio.get_running_loop()
        while self.paused:
            await asyncio.sleep(self.tick)
            self.sweep(loop.time())

    async def close(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None and not sweeper.done():
            sweeper.cancel()
            try:
                await sweeper
            except asyncio.CancelledError:
                pass


class DeadlineHandler(web.RequestHandler):
    """aiohttp's per-connection protocol, reporting its write pauses to `deadlines`,
    and its end to `on_lost` (set by the forwarding relay, sidecar/edge/watches.py,
    while an exchange of this connection is in flight: the client is gone, its upstream
    exchange is let go at once instead of at the relay's next poll)."""

    __slots__ = ("_deadlines", "on_lost")

    def __init__(self, manager: web.Server, deadlines: WriteDeadlines, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._deadlines = deadlines
        self.on_lost: Callable[[], None] | None = None

    def pause_writing(self) -> None:
        super().pause_writing()
        transport = self.transport
        if transport is not None:
            self._deadlines.pause(self, transport)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._deadlines.resume(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadlines.resume(self)
        on_lost, self.on_lost = self.on_lost, None
        super().connection_lost(exc)
        if on_lost is not None:
            try:
                on_lost()
            except Exception:  # a transport callback must not raise
                log.exception("letting go of the exchange of a closed connection failed")


class DeadlineServer(web.Server):
    """aiohttp's low-level server whose connections have a write deadline."""

    def __init__(self, handler: Any, deadlines: WriteDeadlines, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.deadlines = deadlines
        # What each connection's RequestHandler takes (the rest is the server's own).
        self._handler_args = {
            k: v
            for k, v in kwargs.items()
            if k not in ("request_factory", "handler_cancellation", "loop")
        }

    def __call__(self) -> web.RequestHandler:
        return DeadlineHandler(
            self, self.deadlines, loop=asyncio.get_running_loop(), **self._handler_args
        )


__all__ = ["DeadlineHandler", "DeadlineServer", "WriteDeadlines"]

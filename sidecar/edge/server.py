"""Serving the sidecar's app: an aiohttp server that hands every request straight to
the app's front door (`FRONT_DOOR`, set by `sidecar.app`), and the shutdown with a deadline
(DESIGN §9).

aiohttp's `Application` resolves each request through its router and middleware chain
before the handler runs; the sidecar has one route, so that work is pure cost on every
request. `FrontDoorRunner` is aiohttp's low-level `web.ServerRunner` around a
`web.Server` whose handler is the front door (with the app's `handler_args`,
`HANDLER_ARGS`); it runs the app's own startup, shutdown and cleanup
around it, in the order `web.AppRunner` does. Its connections have a write deadline
(`CLIENT_WRITE_TIMEOUT`, the app's `limits.clientWriteTimeout`: sidecar/edge/write_deadline.py).
Public aiohttp API only.

Shutdown (`drain`): aiohttp's own waits for a handler up to its timeout, then cancels
it and waits up to the timeout again, so requests in flight were cut at about twice
the grace, and a handler that outlived its cancellation held the exit longer still.
`drain(grace)` instead stops accepting, closes every connection once its request in
flight is answered, ends open watches at once (the app's `on_shutdown`: cleanly, so
their clients see the end of the stream and watch again), lets the requests in flight
finish until the deadline, then cancels
those still open and gives them `CANCEL_SECONDS` to unwind (the quota stage hands what
they reserved to its settling, never releasing it blindly: DESIGN §7). The cleanup that
follows waits for no handler any more: the runner's shutdown timeout is
`CANCEL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sidecar.edge.write_deadline import DeadlineServer, WriteDeadlines

log = logging.getLogger("sidecar")

# How long cancelled handlers get to unwind, and the cleanup's own handler wait.
CANCEL_SECONDS = 0.2

Route = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The app's front door (`sidecar.app` sets it, see its docstring), served here.
FRONT_DOOR: web.AppKey[Route] = web.AppKey("front_door")
# The app's `handler_args` (aiohttp's per-connection limits), which the front door's
# server is built with too.
HANDLER_ARGS: web.AppKey[dict[str, Any]] = web.AppKey("handler_args")
# Seconds a client may read nothing of what waits for it (`limits.clientWriteTimeout`).
CLIENT_WRITE_TIMEOUT: web.AppKey[float] = web.AppKey("client_write_timeout")


class FrontDoorRunner(web.ServerRunner):
    """Serves `app[FRONT_DOOR]`; `server_args` go to `web.Server` (for example
    `access_log=None`) on top of the app's `HANDLER_ARGS`. Construct it inside the
    event loop."""

    def __init__(
        self,
        app: web.Application,
        *,
        handle_signals: bool = False,
        shutdown_timeout: float = CANCEL_SECONDS,
        **server_args: Any,
    ) -> None:
        self.app = app
        # The handler task of every request in flight (added and removed by the
        # handler itself, so a request is tracked from its first line to its last).
        self.in_flight: set[asyncio.Task[object]] = set()
        front_door = app[FRONT_DOOR]
        in_flight = self.in_flight

        async def tracked(request: web.BaseRequest) -> web.StreamResponse:
            task = asyncio.current_task()
            if task is not None:
                in_flight.add(task)
            try:
                return await front_door(request)  # type: ignore[arg-type]
            finally:
                if task is not None:
                    in_flight.discard(task)

        handler_args: dict[str, Any] | None = app.get(HANDLER_ARGS)
        args: dict[str, Any] = {**(handler_args or {}), **server_args}
        timeout = app.get(CLIENT_WRITE_TIMEOUT)
        self.write_deadlines = WriteDeadlines(timeout) if timeout else None
        server: web.Server
        if self.write_deadlines is None:
            server = web.Server(tracked, **args)
        else:
            server = DeadlineServer(tracked, self.write_deadlines, **args)
        super().__init__(server, handle_signals=handle_signals, shutdown_timeout=shutdown_timeout)

    async def setup(self) -> None:
        # As web.AppRunner: startup handlers may still add shutdown/cleanup handlers.
        self.app.on_startup.freeze()
        await self.app.startup()
        self.app.freeze()
        await super().setup()

    async def shutdown(self) -> None:
        await self.app.shutdown()

    async def cleanup(self) -> None:
        await super().cleanup()
        if self.write_deadlines is not None:
            await self.write_deadlines.close()
        await self.app.cleanup()

    async def drain(self, grace: float) -> None:
        """Stop accepting, end watches, let requests finish until `grace` seconds from
        now, then cancel the rest (see the module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for site in list(self.sites):
            await site.stop()
        if self.server is not None:
            # Every connection closes once its request in flight is answered (idle ones
            # now): a client's next request, a re-watch too, goes to another process.
            self.server.pre_shutdown()
        await self.shutdown()  # the app's on_shutdown: open watches end at once
        pending = {t for t in self.in_flight if not t.done()}
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
        cut = {t for t in self.in_flight if not t.done()}
        if cut:
            log.warning(
                "shutdown: %d requests still open after %.1f s are cancelled", len(cut), grace
            )
            for task in cut:
                task.cancel()
            await asyncio.wait(cut, timeout=CANCEL_SECONDS)


__all__ = ["CANCEL_SECONDS", "CLIENT_WRITE_TIMEOUT", "FrontDoorRunner"]

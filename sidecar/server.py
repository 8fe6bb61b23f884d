"""Serving the sidecar's app: an aiohttp `AppRunner` whose server hands every request
straight to the app's front door (`sidecar.app.FRONT_DOOR`).

aiohttp's `Application` resolves each request through its router and middleware chain
before the handler runs; the sidecar has one route, so that work is pure cost on every
request. This runner keeps everything else of `AppRunner` (the app's startup, shutdown
and cleanup, the request objects, the shutdown grace) and only replaces the server's
request handler. `Server.request_handler` is read by each new connection's protocol
(tests/system/test_dependency_contracts.py checks it).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.web_server import Server

from sidecar.app import FRONT_DOOR


class FrontDoorRunner(web.AppRunner):
    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.request_handler = self.app[FRONT_DOOR]  # type: ignore[assignment]
        return server


__all__ = ["FrontDoorRunner"]

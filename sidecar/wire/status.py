"""A `StatusError` as an aiohttp response: the one place a Status body meets HTTP."""

from __future__ import annotations

from aiohttp import web

from sidecar.core.status import StatusError


def response(exc: StatusError) -> web.Response:
    """The answer for `exc`: its code, its encoded Status body, its headers."""
    return web.Response(
        status=exc.code,
        body=exc.body_bytes(),
        content_type="application/json",
        headers=exc.headers,
    )

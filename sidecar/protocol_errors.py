"""Status bodies for errors aiohttp's HTTP parser raises before any handler runs
(an unknown method, a request line or header over aiohttp's own limits, bad framing).

aiohttp answers those with plain text from `RequestHandler.handle_error`; this wraps
it so clients get a Kubernetes `Status` like every other sidecar error.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import BadHttpMethod, LineTooLong

from sidecar.errors import status_body

_original = web_protocol.RequestHandler.handle_error


def _handle_error(
    self: web_protocol.RequestHandler,
    request: Any,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> web.StreamResponse:
    response = _original(self, request, status, exc, message)
    if status >= 500:
        return response
    code = status
    if isinstance(exc, BadHttpMethod):
        code = 405
        text = "the HTTP method is not allowed"
    elif isinstance(exc, LineTooLong):
        code = 431
        text = "the request line or a header is too long"
    else:
        text = f"malformed HTTP request: {exc.__class__.__name__ if exc else message}"
    body = web.Response(
        status=code,
        body=json.dumps(status_body(code, text)).encode(),
        content_type="application/json",
    )
    body.force_close()
    return body


def install() -> None:
    """Idempotent; affects this process's aiohttp servers only."""
    if web_protocol.RequestHandler.handle_error is not _handle_error:
        web_protocol.RequestHandler.handle_error = _handle_error  # type: ignore[method-assign]

"""Status bodies for errors aiohttp's HTTP parser raises before any handler runs
(an unknown method, a request line or header over aiohttp's own limits, bad framing).

aiohttp answers those with plain text from `RequestHandler.handle_error` and logs each
with a full traceback; this wraps it so clients get a Kubernetes `Status` like every
other sidecar error, and the log gets one line per malformed request, at most one a
second per process (with a count of the ones left out): anyone can send malformed
requests, unauthenticated, so they must not be able to flood the log.

aiohttp offers no hook for these answers, so `install()` replaces a method of its
`RequestHandler` for the whole process. That is an aiohttp internal: aiohttp is pinned
below its next minor release, and tests/system/test_dependency_contracts.py fails if the
method's signature or the way parser errors reach it changes.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import BadHttpMethod, LineTooLong

from sidecar.core.redact import redact_text
from sidecar.core.status import status_body

log = logging.getLogger("sidecar.protocol")

_original = web_protocol.RequestHandler.handle_error


class RateLimitedLog:
    """At most one line per `interval` seconds; the next line counts those dropped."""

    def __init__(self, logger: logging.Logger, interval: float = 1.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last = float("-inf")
        self.suppressed = 0

    def warning(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            self.suppressed += 1
            return
        self._last = now
        if self.suppressed:
            message += f" ({self.suppressed} more malformed requests not logged)"
            self.suppressed = 0
        self.logger.warning("%s", message)


malformed_log = RateLimitedLog(log)


def _handle_error(
    self: web_protocol.RequestHandler,
    request: Any,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> web.StreamResponse:
    if status >= 500:
        # A sidecar bug or a handler timeout, not a client's mistake: aiohttp's own
        # answer and traceback.
        return _original(self, request, status, exc, message)
    if request.writer.output_size > 0:
        raise ConnectionError("the response has started; the error cannot be sent")
    code = status
    if isinstance(exc, BadHttpMethod):
        code = 405
        text = "the HTTP method is not allowed"
    elif isinstance(exc, LineTooLong):
        code = 431
        text = "the request line or a header is too long"
    else:
        text = f"malformed HTTP request: {exc.__class__.__name__ if exc else message}"
    # A parser's complaint can quote the request's bytes: an over-long line's start (a
    # token, in an Authorization header) is never logged, any other quote is redacted.
    quoted = "" if isinstance(exc, LineTooLong) else str(exc or message or "")
    detail = redact_text(quoted.replace("\n", " "))[:200]
    malformed_log.warning(
        f"malformed request from {request.remote}: {code} {text}"
        + (f" ({detail!r})" if detail else "")
    )
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

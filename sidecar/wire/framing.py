"""Request framing rules of the sidecar's own listener (DESIGN §8) that aiohttp does not
enforce by itself:

- the request target must be origin-form (`/path?query`): `CONNECT host:port` is 405,
  absolute-form (`http://host/path`), asterisk-form (`*`) and the rest are 400, each
  with a Status body instead of aiohttp's text/plain 404;
- `Expect: 100-continue` gets its `100 Continue` only when the body is first read (by a
  stage through `RequestContext.read_body`, or by the proxy when it starts streaming),
  which is after authentication, rate limit, authorization and quota have passed. A
  request answered before that gets its final status without the body being read, and
  its connection is closed right after it, since the body's fate is unknown;
- a request whose body turned out malformed (bad chunked framing) closes its
  connection after the answer: the bytes that follow cannot be trusted to start a
  request.

The rest of the framing rules live where they apply: `handler_args` in `app.py`
(bodies are never decompressed, the header timeout), `proxy.py` (what is forwarded).

`request.writer` and `request.protocol.force_close()` are aiohttp internals (aiohttp
is pinned; tests/system/test_dependency_contracts.py checks both).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http import HttpVersion11

from sidecar.core.status import status_body

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _Expecting:
    """Per request, shared by the request and its clones (their state dicts are
    shallow copies, so this object is the same in each)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = True


_EXPECT_KEY: web.RequestKey[_Expecting] = web.RequestKey("sidecar.expect-continue", _Expecting)


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """The route's `Expect` handler: runs before the handler, answers nothing for
    `100-continue` (see `send_continue`), 417 for any other expectation."""
    if request.version < HttpVersion11:
        return None  # HTTP/1.0 has no Expect (RFC 9110 §10.1.1): ignore it
    expect = request.headers.get("Expect", "").strip().lower()
    if expect == "100-continue":
        request[_EXPECT_KEY] = _Expecting()
        return None
    response = _status(
        417, "ExpectationFailed", "the only expectation the sidecar supports is 100-continue"
    )
    await _answer_and_close(request, response)
    return response


async def send_continue(request: web.BaseRequest) -> None:
    """Called right before the body is first read: sends the `100 Continue` the client
    waits for, once. A no-op for requests that did not ask for it."""
    state = request.get(_EXPECT_KEY)
    if isinstance(state, _Expecting) and state.pending:
        state.pending = False
        writer = request.writer
        await writer.write(_CONTINUE)
        # Not part of the final response: aiohttp checks output_size to know whether
        # an error answer can still be sent (as its own expect handler does).
        writer.output_size = 0


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.Response(
        status=code,
        body=json.dumps(status_body(code, message, reason)).encode(),
        content_type="application/json",
    )


def _target_error(request: web.Request) -> web.Response | None:
    if request.method == "CONNECT":
        return _status(405, "MethodNotAllowed", "CONNECT is not supported")
    raw = request.raw_path
    if not raw.startswith("/") or raw.startswith("//"):
        return _status(
            400, "BadRequest", "the request target must be a path starting with a single '/'"
        )
    return None


async def _answer_and_close(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Send `response` now and close the connection after it, without reading (or
    lingering on) the unread body."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    # RequestHandler.force_close: closes the transport once the answer is flushed, and
    # stops aiohttp from reading the unread body for `lingering_time` first.
    request.protocol.force_close()


WebHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def guard(request: web.Request, handler: WebHandler) -> web.StreamResponse:
    """Middleware: origin-form targets only; a response given without the expected
    body being read, or after a malformed body, ends the connection."""
    refusal = _target_error(request)
    if refusal is not None:
        await _answer_and_close(request, refusal)
        return refusal
    response = await handler(request)
    state = request.get(_EXPECT_KEY)
    if isinstance(state, _Expecting) and state.pending and not response.prepared:
        await _answer_and_close(request, response)
    elif request.content.exception() is not None:
        response.force_close()
    return response

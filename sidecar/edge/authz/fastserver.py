"""A lean HTTP/1.1 server for the decision listener (`authz.listen`).

The listener's questions are small and many: a request line and headers (Envoy,
nginx), at most a small JSON body (Kubernetes), answered with a few headers and
usually no body. aiohttp's server costs more per request than the whole cached
decision, so this listener parses with llhttp (`httptools`, already the upstream
client's parser) on an `asyncio.Protocol`, answers in order on kept-alive
connections (pipelining included), and writes pre-encoded answers. It is reached
only by the fronts on loopback (DESIGN §13); anything it cannot parse is a 400 and
the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools

log = logging.getLogger("sidecar.authz")

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
# Questions read ahead of their answers on one connection before reading pauses.
MAX_PIPELINED = 32
_REASONS = {
    200: b"OK",
    201: b"Created",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Payload Too Large",
    415: b"Unsupported Media Type",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


@dataclass(slots=True)
class Question:
    """One request to the listener."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    remote: str

    def header(self, name: str) -> str | None:
        """The first value of header `name` (lower-case), or None."""
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


Handler = Callable[[Question], Awaitable[bytes]]


def encode(
    status: int, headers: list[tuple[str, str]] | tuple[tuple[str, str], ...], body: bytes = b""
) -> bytes:
    """An HTTP/1.1 answer, whole."""
    reason = _REASONS.get(status, b"Unknown")
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
    for name, value in headers:
        lowered = name.lower()
        if lowered in ("content-length", "transfer-encoding", "connection", "date", "server"):
            continue
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            continue
        lines.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
    lines.append(b"content-length: %d\r\n\r\n" % len(body))
    lines.append(body)
    return b"".join(lines)


_BAD_REQUEST = encode(
    400,
    [("content-type", "application/json")],
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
    b'"message":"the request could not be parsed","reason":"BadRequest","code":400}',
)


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_body_size",
        "_head_size",
        "_headers",
        "_pending",
        "_running",
        "_url",
        "handler",
        "open",
        "parser",
        "remote",
        "transport",
    )

    def __init__(self, handler: Handler, open_connections: set[asyncio.Transport]) -> None:
        self.handler = handler
        self.open = open_connections
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._head_size = 0
        self._pending: deque[tuple[Question, bool]] = deque()
        self._running = False
        self.remote = ""

    # -- asyncio ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not `asyncio.Transport` subclasses; they behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self.open.add(self.transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.open.discard(self.transport)
        self.transport = None
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, _TooLarge):
            self._fail()

    def _fail(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(_BAD_REQUEST)
            transport.close()

    # -- the parser's callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._body = []
        self._body_size = 0
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > MAX_HEAD_BYTES:
            raise _TooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value)
        if self._head_size > MAX_HEAD_BYTES:
            raise _TooLarge
        self._headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > MAX_BODY_BYTES:
            raise _TooLarge
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        try:
            target = self._url.decode("utf-8", "surrogateescape")
        except UnicodeDecodeError:  # pragma: no cover - surrogateescape never fails
            raise _TooLarge from None
        question = Question(
            parser.get_method().decode("latin-1"),
            target,
            self._headers,
            b"".join(self._body),
            self.remote,
        )
        self._pending.append((question, parser.should_keep_alive()))
        if len(self._pending) >= MAX_PIPELINED and self.transport is not None:
            self.transport.pause_reading()  # resumed once the answers catch up
        if not self._running:
            self._running = True
            _TASKS.add(task := asyncio.ensure_future(self._answer_all()))
            task.add_done_callback(_TASKS.discard)

    # -- answering, in order -----------------------------------------------------------------

    async def _answer_all(self) -> None:
        try:
            while self._pending:
                question, keep_alive = self._pending.popleft()
                if len(self._pending) == MAX_PIPELINED // 2 and self.transport is not None:
                    self.transport.resume_reading()
                try:
                    answer = await self.handler(question)
                except Exception:
                    log.exception("decision listener: internal error")
                    answer = encode(
                        500,
                        [("content-type", "application/json")],
                        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
                        b'"message":"internal error in the decider","reason":"InternalError",'
                        b'"code":500}',
                    )
                transport = self.transport
                if transport is None or transport.is_closing():
                    return
                transport.write(answer)
                if not keep_alive:
                    transport.close()
                    return
        finally:
            self._running = False


# The connections' answering tasks (held, as the event loop keeps only weak references).
_TASKS: set[asyncio.Future[None]] = set()


class _TooLarge(Exception):
    pass


class FastServer:
    """The listener: `start()` binds it, `cleanup()` closes it and its connections."""

    def __init__(self, handler: Handler, host: str, port: int, reuse_port: bool) -> None:
        self.handler = handler
        self.host, self.port = host, port
        self.reuse_port = reuse_port
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Transport] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        kwargs: dict[str, Any] = {"reuse_port": True} if self.reuse_port else {}
        self.server = await loop.create_server(
            lambda: _Connection(self.handler, self.connections), self.host, self.port, **kwargs
        )

    async def cleanup(self) -> None:
        if self.server is not None:
            self.server.close()
            for transport in list(self.connections):
                transport.close()
            self.server = None

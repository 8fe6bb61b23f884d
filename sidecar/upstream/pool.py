"""The upstream HTTP/1.1 client: a keep-alive connection pool on asyncio protocols, its
answers parsed by httptools (llhttp, the C parser uvicorn and Node.js use).

It replaces aiohttp's `ClientSession` on the forwarding path: aiohttp's client side was
about half of a bare aiohttp proxy's CPU per request (docs/performance.md), so a leaner
client is what pays for the pipeline. What it guarantees (tests/sidecar/
test_upstream_pool.py, and the proxy and tests/security suites through the sidecar):

- One exchange per connection at a time. A connection goes back to the pool only after
  a complete answer that allows keep-alive, with nothing after it. A parse error, a
  cancellation, a partial answer, a body on a HEAD answer, any byte arriving while the
  connection is idle: the connection is closed, never reused, so no byte of one
  exchange is ever read as part of another.
- Interim `1xx` answers are skipped (the sidecar never sends `Expect`, but an upstream
  may send `100` anyway); `101` is a broken exchange (the sidecar never asks to
  upgrade). A HEAD answer ends at its headers; `204`/`304` have no body; a body with
  neither Content-Length nor chunked framing ends when the upstream closes. Chunked
  trailers are read and dropped.
- Request bodies are bytes (sent with their Content-Length) or an async iterator of
  bytes, streamed with the caller's Content-Length or chunked, waiting whenever the
  socket's send buffer is full. Answer bodies are queued up to `HIGH_WATER` bytes, then
  the socket is not read until the reader catches up.
- A request on a reused connection that finds it closed before any answer byte is
  retried once on a new connection, only when it is idempotent and its body is not a
  stream (it cannot have been acted on twice, and it can be sent again).
- At most `size` connections; further callers wait for one (under their own timeout).
- A connection idle for `idle_seconds` is closed by the pool's reaper (one task per
  pool, running only while connections are idle, waking when the oldest one's time is
  up), so a burst of connections (after an upstream stall) does not stay open for good.
- Header names and values containing CR, LF or NUL are refused (`ValueError`) before
  anything is sent: no header can smuggle another line upstream.

Timeouts: `request(within=…)` gives the exchange a deadline that covers waiting for a
connection, sending the request and reading the answer until `release()` (or
`disarm()`, after which the caller times its own reads). Deadlines are checked by one
ticker every `TICK_SECONDS`, not by a timer per request: a timer handle per request
(what `asyncio.timeout` arms) costs several microseconds on every request, and a
deadline firing up to a tick late is fine for timeouts of seconds. An expired
exchange raises `UpstreamTimeout` (a `TimeoutError`) and closes its connection; a
cancelled one closes its connection too.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict

TICK_SECONDS = 0.05
HIGH_WATER = 256 * 1024
IDLE_SECONDS = 30.0
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# Methods sent without a body get no `Content-Length: 0` (as browsers and aiohttp do).
_BODILESS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT"})

Body = bytes | AsyncIterator[bytes] | None


class UpstreamUnreachable(Exception):
    """No connection could be made (refused, unresolvable, connect timeout)."""


class UpstreamBroken(Exception):
    """The exchange failed after connecting: reset, closed early, or not valid HTTP."""


class UpstreamTimeout(TimeoutError):
    """The exchange's deadline passed."""


class Response:
    """One upstream answer: status and headers at once, the body as it arrives.

    Callers must end with `release()` (or `close()`), which returns the connection to
    the pool only when the whole answer was read and the connection may be reused."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_done",
        "_error",
        "_released",
        "_size",
        "_waiter",
        "content_length",
        "headers",
        "reason",
        "status",
    )

    def __init__(
        self,
        conn: _Connection,
        status: int,
        reason: str,
        headers: CIMultiDict[str],
        content_length: int | None,
    ) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self.content_length = content_length
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._released = False

    @property
    def complete(self) -> bool:
        """Whether the whole answer has arrived."""
        return self._done

    async def readany(self) -> bytes:
        """The next body bytes as they arrived; `b""` at the end of the answer. Raises
        UpstreamBroken when the answer was cut short."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        self._conn.resume()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def disarm(self) -> None:
        """From now on the caller times the reads itself (long or streamed answers)."""
        self._conn.pool.disarm(self._conn)

    def rearm(self, within: float) -> None:
        """A new deadline for this exchange, `within` seconds from now, checked by the
        pool's ticker like the first (no timer is armed): a read past it raises
        `UpstreamTimeout`. A streamed answer re-arms before each read and disarms
        while it writes to its client (the client's pace is not the upstream's)."""
        conn = self._conn
        if not conn.lost:
            conn.pool.arm_within(conn, within)

    def release(self) -> None:
        """Done with this answer: the connection is pooled when it is reusable, else
        closed."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        if self._done and self._error is None and not self._chunks and conn.reusable:
            conn.pool.put_back(conn)
        else:
            conn.abort()

    def close(self) -> None:
        """Done with this answer, its connection is closed whatever its state."""
        self._released = True
        self._conn.abort()

    # -- called by the connection -----------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self._done and self._error is None:  # the first cause is the one told
            self._error = exc
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One upstream connection; also the httptools parser's callback object."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.reusable = True
        self.lost = False
        self.idle_since = 0.0
        self._forgotten = False
        self._busy = False  # an exchange is waiting for (the rest of) its answer
        self._parser: Any = None
        self._head: asyncio.Future[Response] | None = None
        self._response: Response | None = None
        self._is_head_request = False
        self._received = False
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._reason = ""
        self._interim = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._read_paused = False
        self._close_delimited = False
        self.timed_out = False
        self._sending: asyncio.Task[Any] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._busy:  # nothing may arrive between exchanges
            self.abort()
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken("the upstream switched protocols")
        except httptools.HttpParserError as exc:
            self._broken(f"the upstream's answer is not valid HTTP: {exc}")

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost says what that means

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        response = self._response
        if (
            exc is None
            and response is not None
            and not response.complete
            and response.content_length is None
            and self._close_delimited
        ):
            response._finish()  # a body framed by the connection's end
        else:
            reason = "the upstream closed the connection" if exc is None else str(exc)
            self._fail(UpstreamBroken(reason or type(exc).__name__))
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(UpstreamBroken("the upstream closed the connection"))
        self._forget()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks --------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._busy:
            raise _Unexpected("a second answer nobody asked for")
        self._headers = CIMultiDict()
        self._reason = ""

    def on_status(self, status: bytes) -> None:
        self._reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._response is None:  # after the body: chunked trailers, dropped
            # As aiohttp decodes them: UTF-8 values arrive as the same text.
            self._headers.add(
                name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")
            )

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._interim = True  # 101 makes feed_data raise HttpParserUpgrade
            return
        headers = self._headers
        length_header = headers.get("Content-Length")
        length = int(length_header) if length_header is not None else None
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self._close_delimited = (
            length is None
            and not chunked
            and status not in (204, 304)
            and not self._is_head_request
        )
        response = Response(self, status, self._reason, headers, length)
        self._response = response
        head = self._head
        if head is not None and not head.done():
            head.set_result(response)
        if self._is_head_request:
            # A HEAD answer ends at its headers whatever its Content-Length says; a
            # byte after them (which the parser would take for a body) ends the
            # connection.
            if (
                "close" in headers.get("Connection", "").lower()
                or self._parser.get_http_version() != "1.1"
            ):
                self.reusable = False
            self._busy = False
            response._finish()

    def on_body(self, body: bytes) -> None:
        if not self._busy:
            raise _Unexpected("a body after a HEAD answer")
        response = self._response
        if response is not None:
            response._feed(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if not self._busy:
            return  # the end of a HEAD answer's (absent) body
        if not self._parser.should_keep_alive():
            self.reusable = False
        self._busy = False
        if self._response is not None:
            self._response._finish()

    # -- the exchange ---------------------------------------------------------------

    async def exchange(
        self, head: bytes, body: Body, is_head: bool, chunked: bool = False
    ) -> Response:
        """Send one request and wait for its answer's headers."""
        transport = self.transport
        if self.lost or transport is None:
            raise UpstreamBroken("the upstream closed the connection")
        loop = asyncio.get_running_loop()
        self._is_head_request = is_head
        self._received = False
        self._response = None
        self._interim = False
        self._close_delimited = False
        self._parser = httptools.HttpResponseParser(self)
        self._busy = True
        self._head = loop.create_future()
        if body is None:
            transport.write(head)
        elif isinstance(body, bytes):
            transport.writelines((head, body))
        else:
            transport.write(head)
            self._sending = asyncio.current_task()
            try:
                await self._send_stream(body, chunked)
            finally:
                self._sending = None
        return await self._head

    async def _send_stream(self, body: AsyncIterator[bytes], chunked: bool) -> None:
        transport = self.transport
        assert transport is not None
        async for chunk in body:
            if not chunk:
                continue
            if self.lost:
                raise UpstreamBroken("the upstream closed the connection")
            if chunked:
                transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            else:
                transport.write(chunk)
            if self._write_paused:
                self._drain = asyncio.get_running_loop().create_future()
                try:
                    await self._drain
                finally:
                    self._drain = None
        if chunked:
            transport.write(b"0\r\n\r\n")

    @property
    def received_nothing(self) -> bool:
        return not self._received

    def time_out(self) -> None:
        """The exchange's deadline passed: fail it and close the connection (a task
        still sending a streamed body is cancelled; `request` turns that into
        UpstreamTimeout)."""
        self.timed_out = True
        self._fail(UpstreamTimeout("the upstream did not answer in time"))
        if self._sending is not None:
            self._sending.cancel()
        self.abort()

    def _broken(self, reason: str) -> None:
        self._fail(UpstreamBroken(reason))
        self.abort()

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        elif self._response is not None:
            self._response._fail(exc)

    def pause(self) -> None:
        if not self._read_paused and self.transport is not None and not self.lost:
            self._read_paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._read_paused and self.transport is not None and not self.lost:
            self._read_paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.lost:
            self.transport.abort()
        self._forget()

    def _forget(self) -> None:
        self.pool.disarm(self)
        if not self._forgotten:
            self._forgotten = True
            self.pool.forget(self)

    def reset_for_idle(self) -> None:
        self._head = None
        self._response = None
        self._parser = None


class _Unexpected(Exception):
    """Raised from a parser callback: bytes the exchange did not ask for."""


class UpstreamPool:
    """At most `size` keep-alive connections to one upstream (`http://host:port[/prefix]`,
    `https://…`, or `unix:/path`)."""

    def __init__(
        self,
        upstream: str,
        size: int,
        connect_timeout: float,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self.size = size
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self._unix_path: str | None = None
        self._ssl: ssl.SSLContext | None = None
        if upstream.startswith("unix:"):
            self._unix_path = upstream[len("unix:") :]
            self.host_header = "localhost"
            self.prefix = ""
            self._host, self._port = "localhost", 0
        else:
            parts = urlsplit(upstream)
            secure = parts.scheme == "https"
            self._host = parts.hostname or "127.0.0.1"
            self._port = parts.port or (443 if secure else 80)
            self.host_header = parts.netloc.rsplit("@", 1)[-1]
            self.prefix = parts.path.rstrip("/")
            if secure:
                self._ssl = ssl.create_default_context()
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._deadlines: dict[_Connection, float] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: Body = None,
        content_length: int | None = None,
        within: float | None = None,
    ) -> Response:
        """Send `method target` (target already percent-encoded, without the pool's
        prefix) and return the answer once its headers have arrived. `within`: the
        exchange's deadline in seconds (see the module docstring), None for none."""
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers]
        streamed = body is not None and not isinstance(body, bytes)
        if isinstance(body, bytes):
            lines.append(f"Content-Length: {len(body)}")
        elif streamed:
            lines.append(
                f"Content-Length: {content_length}"
                if content_length is not None
                else "Transfer-Encoding: chunked"
            )
        elif method not in _BODILESS:
            lines.append("Content-Length: 0")
        text = "\r\n".join(lines) + "\r\n\r\n"
        # Exactly one CRLF per line and no NUL: no value can start a header or a request.
        if text.count("\n") != len(lines) + 1 or text.count("\r") != len(lines) + 1:
            raise ValueError("a header name or value contains CR or LF")
        if "\0" in text:
            raise ValueError("a header name or value contains NUL")
        head = text.encode("utf-8", "surrogateescape")
        is_head = method == "HEAD"
        chunked = streamed and content_length is None
        retriable = method in IDEMPOTENT and not streamed
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        while True:
            conn, reused = await self._acquire(deadline)
            if deadline is not None:
                self._arm(conn, deadline)
            try:
                return await conn.exchange(head, body, is_head, chunked)
            except UpstreamBroken:
                conn.abort()
                if reused and retriable and conn.received_nothing:
                    retriable = False  # once
                    continue
                raise
            except asyncio.CancelledError:
                conn.abort()
                task = asyncio.current_task()
                if conn.timed_out and task is not None and task.uncancel() == 0:
                    raise UpstreamTimeout("the upstream did not answer in time") from None
                raise
            except BaseException:
                conn.abort()
                raise

    # -- deadlines ------------------------------------------------------------------

    def _arm(self, conn: _Connection, deadline: float) -> None:
        self._deadlines[conn] = deadline
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    def arm_within(self, conn: _Connection, within: float) -> None:
        """`conn`'s exchange times out `within` seconds from now."""
        self._arm(conn, asyncio.get_running_loop().time() + within)

    def disarm(self, conn: _Connection) -> None:
        self._deadlines.pop(conn, None)

    async def _tick(self) -> None:
        """While any exchange has a deadline: every tick, time out those past it."""
        loop = asyncio.get_running_loop()
        while self._deadlines:
            await asyncio.sleep(TICK_SECONDS)
            now = loop.time()
            for conn in [c for c, due in self._deadlines.items() if due <= now]:
                self._deadlines.pop(conn, None)
                conn.time_out()

    async def _acquire(self, deadline: float | None = None) -> tuple[_Connection, bool]:
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise UpstreamUnreachable("the sidecar is shutting down")
            now = loop.time()
            while self._idle:
                conn = self._idle.pop()
                if conn.reusable and not conn.lost and now - conn.idle_since < self.idle_seconds:
                    return conn, True
                conn.abort()
            if self._open < self.size:
                self._open += 1  # _connect gives it back when it fails
                return await self._connect(), False
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the turn on
                raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self._unix_path is not None:
                    await loop.create_unix_connection(lambda: conn, self._unix_path)
                else:
                    await loop.create_connection(
                        lambda: conn,
                        self._host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host if self._ssl else None,
                    )
        except BaseException as exc:
            conn.abort()  # gives its place in the pool back, once
            if isinstance(exc, TimeoutError):
                raise UpstreamUnreachable("connecting to the upstream timed out") from None
            if isinstance(exc, OSError):
                raise UpstreamUnreachable(str(exc) or type(exc).__name__) from None
            raise
        return conn

    def put_back(self, conn: _Connection) -> None:
        """A finished exchange's connection, reusable: idle until the next request."""
        self.disarm(conn)
        if self._closed or conn.lost:
            conn.abort()
            return
        conn.reset_for_idle()
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        self._idle.append(conn)
        if self._reaper is None or self._reaper.done():
            self._reaper = loop.create_task(self._reap())
        self._wake_one()

    async def _reap(self) -> None:
        """While any connection is idle: close those idle for `idle_seconds`, oldest
        first (`_idle` is in the order they went idle: new ones are appended and the
        newest is reused first), then sleep until the next one's time is up."""
        loop = asyncio.get_running_loop()
        # No await between finding nothing idle and returning, so a connection that
        # `put_back` adds is always seen by this task or starts a new one.
        while self._idle:
            due = self._idle[0].idle_since + self.idle_seconds - loop.time()
            if due > 0:
                await asyncio.sleep(due)
                continue
            self._idle.pop(0).abort()

    def forget(self, conn: _Connection) -> None:
        """`conn` is closed: it no longer counts against the pool's size."""
        self._open -= 1
        if conn in self._idle:
            self._idle.remove(conn)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close the idle connections now; busy ones close when their exchange ends."""
        self._closed = True
        for task in (self._ticker, self._reaper):
            if task is not None:
                task.cancel()
        for conn in list(self._idle):
            conn.abort()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

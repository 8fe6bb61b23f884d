"""Raw HTTP/1.1 for the framing tests: a strict message reader, a raw upstream server
(its own thread and event loop, keep-alive, records every request it parses), and a
raw client that sends bytes as-is and reads the answers.

The reader refuses anything a lenient server might read two ways: bare LF, obs-fold,
whitespace before a colon, a repeated or non-digit Content-Length, a Transfer-Encoding
other than exactly `chunked`, Content-Length together with Transfer-Encoding, chunk
extensions and trailers. A parse error on the upstream side is a framing desync.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_REQUEST_LINE = re.compile(rb"^([A-Z]+) (\S+) HTTP/1\.1$")
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3}) ?(.*)$")
_MAX_LINE = 65536


class ParseError(Exception):
    """The bytes on the wire are not one strictly well-formed HTTP/1.1 message."""


class Closed(ParseError):
    """The connection ended inside a line."""


class BodyCut(ParseError):
    """The connection ended inside a body: an aborted request, not a malformed one
    (the sender gave up mid-body, e.g. on a 413). `message` holds its head."""

    def __init__(self, message: Message) -> None:
        super().__init__("connection closed inside the body")
        self.message = message


@dataclass
class Message:
    start: bytes
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool

    def values(self, name: str) -> list[str]:
        lower = name.lower()
        return [v for k, v in self.headers if k.lower() == lower]

    def header(self, name: str) -> str | None:
        found = self.values(name)
        return found[0] if found else None

    @property
    def method(self) -> str:
        return self.start.split(b" ", 1)[0].decode()

    @property
    def target(self) -> str:
        return self.start.split(b" ")[1].decode("latin-1")

    @property
    def status(self) -> int:
        return int(self.start.split(b" ")[1])


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise Closed(f"connection closed mid-line: {exc.partial[:80]!r}") from None
        raise EOFError from None
    except asyncio.LimitOverrunError:
        raise ParseError("line too long") from None
    if not raw.endswith(b"\r\n"):
        raise ParseError(f"bare LF: {raw[:80]!r}")
    return raw[:-2]


async def read_message(
    reader: asyncio.StreamReader, *, request: bool, head: bool = False
) -> Message | None:
    """The next message, None on a clean EOF before its first byte; ParseError else."""
    try:
        start = await _line(reader)
    except EOFError:
        return None
    if request and not _REQUEST_LINE.match(start):
        raise ParseError(f"bad request line: {start[:120]!r}")
    if not request and not _STATUS_LINE.match(start):
        raise ParseError(f"bad status line: {start[:120]!r}")
    headers: list[tuple[str, str]] = []
    while True:
        try:
            line = await _line(reader)
        except EOFError:
            raise ParseError("connection closed inside the headers") from None
        if not line:
            break
        if line[:1] in (b" ", b"\t"):
            raise ParseError("obs-fold")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise ParseError(f"bad header line: {line[:120]!r}")
        if b"\r" in value or b"\n" in value or b"\x00" in value:
            raise ParseError("control character in a header value")
        headers.append((name.decode(), value.strip(b" \t").decode("latin-1")))
    msg = Message(start, headers, b"", False)
    lengths = msg.values("Content-Length")
    codings = msg.values("Transfer-Encoding")
    if lengths and codings:
        raise ParseError("both Content-Length and Transfer-Encoding")
    if len(lengths) > 1:
        raise ParseError("repeated Content-Length")
    if len(codings) > 1 or (codings and codings[0] != "chunked"):
        raise ParseError(f"Transfer-Encoding {codings!r}")
    status = 0 if request else msg.status
    if head or status in (204, 304) or 100 <= status < 200:
        return msg
    try:
        if codings:
            msg.chunked = True
            msg.body = await _chunked(reader)
        elif lengths:
            if not lengths[0].isdigit() or len(lengths[0]) > 12:
                raise ParseError(f"Content-Length {lengths[0]!r}")
            msg.body = await reader.readexactly(int(lengths[0]))
        elif not request:
            msg.body = await reader.read()  # close-delimited
    except (asyncio.IncompleteReadError, EOFError, Closed):
        raise BodyCut(msg) from None
    return msg


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await _line(reader)
        if not size_line or not re.fullmatch(rb"[0-9a-fA-F]{1,8}", size_line):
            raise ParseError(f"bad chunk size line {size_line[:40]!r}")
        size = int(size_line, 16)
        if size == 0:
            if await _line(reader) != b"":
                raise ParseError("trailers after the last chunk")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await _line(reader) != b"":
            raise ParseError("chunk data not followed by CRLF")


def response_bytes(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [
        f"HTTP/1.1 {status} X",
        f"Content-Length: {len(body)}",
        "Content-Type: application/json",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# A responder answers one parsed request; it returns False to close the connection.
Responder = Callable[[Message, asyncio.StreamWriter], Awaitable[bool]]


async def ok_responder(msg: Message, writer: asyncio.StreamWriter) -> bool:
    writer.write(response_bytes(200, b'{"kind":"List","items":[]}'))
    await writer.drain()
    return True


@dataclass
class RawUpstream:
    """A keep-alive HTTP/1.1 server on 127.0.0.1 that parses strictly and records."""

    responder: Responder = ok_responder
    received: list[Message] = field(default_factory=list)
    aborted: list[Message] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RawUpstream:
        ready: Future[None] = Future()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def boot() -> None:
                self._server = await asyncio.start_server(
                    self._serve, "127.0.0.1", 0, limit=_MAX_LINE
                )
                self.port = self._server.sockets[0].getsockname()[1]

            loop.run_until_complete(boot())
            ready.set_result(None)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.result(10)
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)

    def snapshot(self) -> tuple[list[Message], list[str]]:
        with self._lock:
            return list(self.received), list(self.errors)

    def clear(self) -> None:
        with self._lock:
            self.received.clear()
            self.aborted.clear()
            self.errors.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
        try:
            while True:
                try:
                    msg = await read_message(reader, request=True)
                except BodyCut as exc:
                    with self._lock:
                        self.aborted.append(exc.message)
                    return
                except ParseError as exc:
                    with self._lock:
                        self.errors.append(str(exc))
                    return
                if msg is None:
                    return
                with self._lock:
                    self.received.append(msg)
                if not await self.responder(msg, writer):
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()


async def exchange(
    port: int,
    data: bytes,
    count: int,
    wait: float = 10.0,
    head: tuple[bool, ...] = (),
) -> tuple[list[Message], bool]:
    """Send `data` on one new connection, read up to `count` answers (fewer if the
    sidecar closes); returns them and whether the connection reached EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=_MAX_LINE)
    answers: list[Message] = []
    closed = False
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(wait):
            while len(answers) < count:
                msg = await read_message(
                    reader, request=False, head=head[len(answers)] if head else False
                )
                if msg is None:
                    closed = True
                    break
                if 100 <= msg.status < 200:
                    continue
                answers.append(msg)
                if (msg.header("Connection") or "").lower() == "close":
                    closed = True
                    break
    except (ConnectionError, ParseError):
        closed = True
    finally:
        writer.close()
    return answers, closed


def request_bytes(
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes | None = None,
    chunks: list[int] | None = None,
) -> bytes:
    """A request as raw bytes: Content-Length framing, or chunked split at `chunks`."""
    lines = [f"{method} {target} HTTP/1.1", "Host: sidecar.test"]
    lines += [f"{k}: {v}" for k, v in headers]
    payload = b""
    if body is not None and chunks is None:
        lines.append(f"Content-Length: {len(body)}")
        payload = body
    elif body is not None and chunks is not None:
        lines.append("Transfer-Encoding: chunked")
        pieces: list[bytes] = []
        start = 0
        for cut in [*sorted({c for c in chunks if 0 < c < len(body)}), len(body)]:
            if cut > start:
                piece = body[start:cut]
                pieces.append(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            start = cut
        payload = b"".join(pieces) + b"0\r\n\r\n"
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


def json_of(msg: Message) -> Any:
    import json

    return json.loads(msg.body)


ADMIN_TOKEN = "admin-token"
ALICE_TOKEN = "alice-token"


def sidecar_config(
    tmp: Any, upstream_url: str, policies: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A sidecar config for the framing tests: admin (system) and alice (acme) tokens,
    the allow-admin test policy unless `policies` is given, no reload."""
    from tests.rigs import paths, processes

    tokens = processes.write_tokens(
        tmp,
        [
            {"token": ADMIN_TOKEN, "user": "admin", "tenant": "system", "groups": ["ops"]},
            {
                "token": ALICE_TOKEN,
                "user": "alice",
                "tenant": "acme",
                "groups": ["tenant-admins", "node-owners"],
            },
        ],
    )
    config: dict[str, Any] = {
        "upstream": upstream_url,
        "policies": policies or str(paths.FIXTURES / "allow_admin"),
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
    }
    config.update(extra)
    return config

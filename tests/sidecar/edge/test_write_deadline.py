"""The client write deadline (sidecar/edge/write_deadline.py): a connection whose client
reads nothing of what waits for it for the timeout is cut, one that keeps reading is
not, and nothing is armed while no write is blocked.

The sweep on a stand-in transport and a given clock; then aiohttp's low-level server
with the deadline's handler in-process, and raw sockets that stop reading."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from sidecar.cli.demo import Authority
from sidecar.edge.write_deadline import DeadlineServer, WriteDeadlines
from tests.rigs.waiting import eventually


class Transport:
    """What the sweep reads of a transport: its buffer size; what it does: abort."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return self.size

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def abort(self) -> None:
        self.aborted = True


async def test_a_client_that_reads_nothing_is_cut_after_the_timeout() -> None:
    deadlines = WriteDeadlines(10.0)
    stuck = Transport(300_000)
    deadlines.pause("stuck", stuck)  # type: ignore[arg-type]
    start = deadlines.paused["stuck"].since
    deadlines.sweep(start + 9.9)
    assert not stuck.aborted
    deadlines.sweep(start + 10.0)
    assert stuck.aborted
    assert deadlines.paused == {}
    assert deadlines.cut == 1
    await deadlines.close()


async def test_a_client_that_reads_keeps_its_connection() -> None:
    deadlines = WriteDeadlines(10.0)
    slow = Transport(300_000)
    deadlines.pause("slow", slow)  # type: ignore[arg-type]
    start = deadlines.paused["slow"].since
    for step in range(1, 30):
        slow.size -= 1  # one byte read per look: the clock starts again each time
        deadlines.sweep(start + step * 9.0)
    assert not slow.aborted
    # More written while paused is no reading: the clock keeps running.
    slow.size += 65536
    deadlines.sweep(start + 30 * 9.0)
    deadlines.sweep(start + 29 * 9.0 + 10.0)
    assert slow.aborted
    await deadlines.close()


async def test_a_drained_connection_is_forgotten() -> None:
    deadlines = WriteDeadlines(10.0)
    drained = Transport(300_000)
    deadlines.pause("drained", drained)  # type: ignore[arg-type]
    start = deadlines.paused["drained"].since
    deadlines.resume("drained")
    deadlines.sweep(start + 100.0)
    assert not drained.aborted
    assert deadlines.paused == {}
    await deadlines.close()


def test_the_sweep_looks_at_least_four_times_per_timeout_and_every_second() -> None:
    assert WriteDeadlines(1.0).tick == 0.25
    assert WriteDeadlines(60.0).tick == 1.0


# -- aiohttp's server with the deadline, in-process ----------------------------------------

PIECE = 64 * 1024


@asynccontextmanager
async def serving(
    deadline: float, pieces: int, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[int, WriteDeadlines, dict[str, Any]]]:
    """A server that answers every GET with `pieces` pieces of 64 KiB, streamed; what
    happened to its last answer goes in the dict (`outcome`: "complete" or the error)."""
    seen: dict[str, Any] = {"done": asyncio.Event()}

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = pieces * PIECE
        await response.prepare(request)
        try:
            for _ in range(pieces):
                await response.write(b"x" * PIECE)
            await response.write_eof()
            seen["outcome"] = "complete"
        except Exception as exc:
            seen["outcome"] = type(exc).__name__
            raise
        finally:
            seen["done"].set()
        return response

    deadlines = WriteDeadlines(deadline)
    server = DeadlineServer(handler, deadlines)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server, "127.0.0.1", 0, ssl=tls)
    try:
        yield listener.sockets[0].getsockname()[1], deadlines, seen
    finally:
        listener.close()
        await server.shutdown(1.0)
        await deadlines.close()


async def _request(port: int, read: bool) -> socket.socket:
    sock = _socket(read)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def _socket(read: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if not read:  # little room on the client's side: the server's writes block early
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.setblocking(False)
    return sock


async def test_a_stalled_reader_is_cut_and_the_handler_unblocked() -> None:
    async with serving(0.2, pieces=256) as (port, deadlines, seen):
        sock = await _request(port, read=False)
        try:
            await eventually(lambda: deadlines.cut == 1, 10, what="the stalled reader is cut")
            await asyncio.wait_for(seen["done"].wait(), 10)  # hang guard
            assert seen["outcome"] != "complete"
        finally:
            sock.close()


async def test_a_stalled_reader_over_tls_is_cut(tmp_path: Path) -> None:
    """Over HTTPS the transport is the TLS layer's, which reports its own pauses."""
    ca = Authority("write deadline test CA")
    cert, key = ca.issue()
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client_tls = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    async with serving(0.2, pieces=256, tls=server_tls) as (port, deadlines, seen):
        sock = _socket(read=False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        _, writer = await asyncio.open_connection(
            sock=sock, ssl=client_tls, server_hostname="127.0.0.1"
        )
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # and never read
            await eventually(lambda: deadlines.cut == 1, 10, what="the stalled reader is cut")
            await asyncio.wait_for(seen["done"].wait(), 10)  # hang guard
            assert seen["outcome"] != "complete"
        finally:
            writer.close()


async def test_a_reader_that_keeps_reading_gets_the_whole_answer() -> None:
    async with serving(0.2, pieces=64) as (port, deadlines, seen):
        sock = await _request(port, read=True)
        loop = asyncio.get_running_loop()
        got = 0
        try:
            async with asyncio.timeout(10):  # hang guard
                while got < 64 * PIECE:
                    chunk = await loop.sock_recv(sock, 65536)
                    assert chunk
                    got += len(chunk)
            await asyncio.wait_for(seen["done"].wait(), 10)
        finally:
            sock.close()
        assert seen["outcome"] == "complete"
        assert deadlines.cut == 0

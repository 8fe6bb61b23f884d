"""What the sidecar relies on in aiohttp beyond its documented API, checked so that an
aiohttp upgrade that changes it fails here, by name, rather than in production.

aiohttp is pinned below the next minor release in pyproject.toml; before raising the
bound, run this file against the new version. The internals used:

- `web_protocol.RequestHandler.handle_error(request, status, exc, message)`, which
  aiohttp calls for requests its HTTP parser refuses before any handler runs;
  `sidecar/protocol_errors.py` replaces it (process-wide) to answer with a `Status` body
  and log one line instead of a traceback. aiohttp has no hook for these answers.
- `request.writer` (`write`, `output_size`) to send `100 Continue` only once the body
  is read, after authorization (`sidecar/framing.py`); aiohttp's own expect handler
  would send it before any stage ran.
- `request.protocol.force_close()`, to close a connection right after an answer given
  without reading the body, instead of draining it for `lingering_time`.


- `Server.request_handler`, which each new connection's protocol reads: the sidecar's
  runner (`sidecar/server.py`) sets it to the app's front door, bypassing the router.

prometheus-client: `sidecar/metrics.py` flushes batched histogram observations into a
labelled child's `_upper_bounds`, `_buckets` (per-bucket, not cumulative) and `_sum`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web, web_protocol
from aiohttp.test_utils import TestServer

from sidecar import framing, protocol_errors
from sidecar.app import FRONT_DOOR
from tests.rigs import paths

ROOT = paths.ROOT


def test_installed_aiohttp_is_within_the_pinned_range() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"aiohttp>=([\d.]+),<([\d.]+)"', text)
    assert found, "aiohttp must keep an upper bound in pyproject.toml"
    installed = tuple(int(p) for p in aiohttp.__version__.split(".")[:2])
    upper = tuple(int(p) for p in found.group(2).split(".")[:2])
    assert installed < upper


def test_handle_error_keeps_its_signature() -> None:
    params = list(inspect.signature(web_protocol.RequestHandler.handle_error).parameters)
    assert params == ["self", "request", "status", "exc", "message"]


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    """A server with the sidecar's framing rules and error patch, and two routes: one
    that reads the body, one that answers without reading it."""
    protocol_errors.install()

    async def reads(request: web.Request) -> web.StreamResponse:
        await framing.send_continue(request)
        body = await request.read()
        return web.json_response({"read": len(body)})

    async def refuses(request: web.Request) -> web.StreamResponse:
        return web.json_response({"refused": True}, status=403)

    app = web.Application(middlewares=[framing.guard])
    app.router.add_route("*", "/reads", reads, expect_handler=framing.expect_handler)
    app.router.add_route("*", "/refuses", refuses, expect_handler=framing.expect_handler)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield srv
    finally:
        await srv.close()


async def _exchange(
    srv: TestServer, head: bytes, body: bytes = b"", wait_continue: bool = False
) -> tuple[bytes, bool]:
    """Send `head` (and `body`, after a 100 when `wait_continue`); everything the
    server sends until it closes the connection or 5 s pass, and whether it closed."""
    assert srv.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    received = b""
    closed = False
    try:
        writer.write(head)
        await writer.drain()
        if wait_continue:
            received = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            if received.startswith(b"HTTP/1.1 100"):
                writer.write(body)
                await writer.drain()
        elif body:
            writer.write(body)
            await writer.drain()
        async with asyncio.timeout(5):
            while chunk := await reader.read(65536):
                received += chunk
            closed = True
    except TimeoutError:
        pass
    finally:
        writer.close()
    return received, closed


async def test_a_malformed_request_goes_through_the_patched_handle_error(
    server: TestServer,
) -> None:
    received, _ = await _exchange(server, b"G@T /reads HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = received.partition(b"\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 4\d\d ", head), received[:200]
    assert b"application/json" in head
    status = json.loads(body)
    assert status["kind"] == "Status"
    assert status["code"] in (400, 405)


async def test_continue_is_sent_through_the_request_writer(server: TestServer) -> None:
    head = (
        b"POST /reads HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
    )
    received, _ = await _exchange(server, head, b"hello", wait_continue=True)
    assert received.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), received[:200]
    assert b"HTTP/1.1 200" in received
    assert b'{"read": 5}' in received


async def test_an_answer_without_reading_closes_through_the_protocol(
    server: TestServer,
) -> None:
    head = b"POST /refuses HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    # Keep-alive was asked for (HTTP/1.1 default) and the body never sent: the server
    # must close the connection after the 403 rather than wait for the body.
    received, closed = await _exchange(server, head, wait_continue=True)
    assert received.startswith(b"HTTP/1.1 403"), received[:200]
    assert b"100 Continue" not in received
    assert closed


def test_installed_prometheus_client_is_within_the_pinned_range() -> None:
    import importlib.metadata

    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"prometheus-client>=([0-9.]+),<([0-9.]+)"', text)
    assert match, "prometheus-client must be pinned with an upper bound in pyproject.toml"
    version = importlib.metadata.version("prometheus-client")
    installed = tuple(int(p) for p in version.split(".")[:2])
    upper = tuple(int(p) for p in match.group(2).split("."))
    assert installed < upper


def test_histogram_children_keep_their_per_bucket_values() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    registry = CollectorRegistry()
    hist = Histogram("h_seconds", "", ["t"], buckets=(1, 2), registry=registry)
    child = hist.labels("x")
    assert list(child._upper_bounds) == [1, 2, float("inf")]
    child._buckets[1].inc(3)  # three observations in (1, 2]
    child._sum.inc(4.5)
    assert registry.get_sample_value("h_seconds_bucket", {"t": "x", "le": "1.0"}) == 0
    assert registry.get_sample_value("h_seconds_bucket", {"t": "x", "le": "2.0"}) == 3
    assert registry.get_sample_value("h_seconds_count", {"t": "x"}) == 3
    assert registry.get_sample_value("h_seconds_sum", {"t": "x"}) == 4.5


async def test_the_front_door_runner_serves_through_the_request_handler() -> None:
    """`FrontDoorRunner` answers through the handler it sets, not the app's router."""
    from sidecar.server import FrontDoorRunner

    app = web.Application()

    async def routed(_: web.Request) -> web.Response:
        return web.Response(text="router")

    async def front(_: web.Request) -> web.Response:
        return web.Response(text="front door")

    app.router.add_get("/", routed)
    app[FRONT_DOOR] = front
    runner = FrontDoorRunner(app)
    await runner.setup()
    try:
        site = web.SockSite(runner, _listening_socket())
        await site.start()
        port = site._sock.getsockname()[1]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/") as resp:
                assert await resp.text() == "front door"
    finally:
        await runner.cleanup()


def _listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock

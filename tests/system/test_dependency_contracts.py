"""What the sidecar relies on in its dependencies beyond their documented API, checked so
that an upgrade that changes it fails here, by name, rather than in production.

The list, with why each is used, is docs/architecture.md "Dependencies' internals we
use": one test here per entry, and `test_the_docs_list_matches_the_code` keeps the list
and the code in step. aiohttp and prometheus-client are pinned below their next minor
release in pyproject.toml; before raising a bound, run this file against the new
version.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import http_exceptions, web, web_protocol
from aiohttp.test_utils import TestServer

from sidecar.edge.server import FRONT_DOOR
from sidecar.wire import framing, protocol_errors
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
    # The parser errors `protocol_errors` tells apart.
    assert issubclass(http_exceptions.BadHttpMethod, http_exceptions.HttpProcessingError)
    assert issubclass(http_exceptions.LineTooLong, http_exceptions.HttpProcessingError)


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


async def test_the_front_door_runner_serves_through_the_front_door() -> None:
    """`FrontDoorRunner` (public aiohttp API only) answers through the app's front
    door, not the app's router, and runs the app's startup and cleanup."""
    from sidecar.edge.server import FrontDoorRunner

    app = web.Application()
    ran: list[str] = []

    async def routed(_: web.Request) -> web.Response:
        return web.Response(text="router")

    async def front(_: web.Request) -> web.Response:
        return web.Response(text="front door")

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        ran.append("startup")
        yield
        ran.append("cleanup")

    app.router.add_get("/", routed)
    app.cleanup_ctx.append(lifecycle)
    app[FRONT_DOOR] = front
    runner = FrontDoorRunner(app)
    await runner.setup()
    try:
        site = web.SockSite(runner, _listening_socket())
        await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/") as resp:
                assert await resp.text() == "front door"
    finally:
        await runner.cleanup()
    assert ran == ["startup", "cleanup"]


def test_the_value_class_is_picked_again_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`values.get_value_class()` reads `PROMETHEUS_MULTIPROC_DIR` when called, and
    metrics made after `values.ValueClass` is replaced keep their values there."""
    from prometheus_client import CollectorRegistry, Counter, values

    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    counter = Counter("contract_total", "", registry=CollectorRegistry())
    counter.inc()
    assert list(tmp_path.glob("counter_*.db")), "the multiprocess value class was not used"


# docs/architecture.md's list: each entry's names, as they appear in the code.
_SECTION = "## Dependencies' internals we use"
_CODE_NAMES = {
    "handle_error": r"RequestHandler\.handle_error",
    "BadHttpMethod": r"\bBadHttpMethod\b",
    "LineTooLong": r"\bLineTooLong\b",
    "writer": r"\brequest\.writer\b",
    "force_close": r"\.protocol\.force_close\b",
    "_upper_bounds": r"\._upper_bounds\b",
    "_buckets": r"\._buckets\b",
    "_sum": r"\._sum\b",
    "ValueClass": r"\bvalues\.ValueClass\b",
    "get_value_class": r"\bvalues\.get_value_class\b",
}
# What would be a dependency internal in a module that imports aiohttp or
# prometheus-client: a private attribute of another object, aiohttp's private modules,
# prometheus-client's value class, the request's writer and protocol.
_SUSPECT = re.compile(
    r"\b(?!self\.|cls\.|os\.|sys\.)\w+\._[a-z]\w*|super\(\)\._[a-z]\w*"
    r"|\bweb_protocol\b|\bhttp_exceptions\b|\bweb_server\b|\bweb_runner\b"
    r"|\bvalues\.(?:ValueClass|get_value_class)\b|\brequest\.writer\b|\.protocol\.\w+"
)
_IMPORTS_DEPENDENCY = re.compile(r"^(?:from|import) (?:aiohttp|prometheus_client)\b", re.M)
# aiohttp's modules whose names the listed entries use.
_MODULES = {"web_protocol": "handle_error", "http_exceptions": "BadHttpMethod"}


def _docs_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def test_the_docs_list_matches_the_code() -> None:
    rows = _docs_rows()
    assert rows, f"docs/architecture.md has no table under {_SECTION!r}"
    this_file = (ROOT / "tests" / "system" / "test_dependency_contracts.py").read_text()
    listed: set[str] = set()
    for library, names, where, _why, tests in rows:
        assert library in ("aiohttp", "prometheus-client"), library
        files = re.findall(r"`(sidecar/[\w/]+\.py)`", where)
        code = "\n".join((ROOT / f).read_text() for f in files)
        found = [k for k in _CODE_NAMES if k in names]
        assert found, f"no known name in {names!r}"
        for key in found:
            assert re.search(_CODE_NAMES[key], code), f"{key} is listed but not in {files}"
            listed.add(key)
        for test in re.findall(r"`(test_\w+)`", tests):
            assert f"def {test}(" in this_file, f"{test} is named in the docs but missing"
    # And every internal the code uses is listed.
    for path in sorted((ROOT / "sidecar").rglob("*.py")):
        text = path.read_text()
        if not _IMPORTS_DEPENDENCY.search(text):
            continue
        for match in _SUSPECT.finditer(text):
            used = match.group(0)
            covered = any(re.search(_CODE_NAMES[k], used) for k in listed)
            module = _MODULES.get(used)
            assert covered or (module in listed), (
                f"{path.relative_to(ROOT)} uses {used!r}: list it in docs/architecture.md"
            )


def _listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock

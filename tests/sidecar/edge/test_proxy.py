"""The streaming reverse proxy against a real aiohttp upstream on 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.app import build_app
from sidecar.config.settings import load_config
from tests.rigs import paths, processes
from tests.rigs.waiting import eventually

ADMIN = {"Authorization": "Bearer admin-token"}
FIXTURES = paths.FIXTURES
MiB = 1024 * 1024


class Upstream:
    """A real upstream that records what it received."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.slow_seconds = 0.0
        self.slow_arrived = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=200 * MiB)
        app.router.add_route("*", "/download/{size}", self.download)
        app.router.add_route("*", "/slow", self.slow)
        app.router.add_route("*", "/truncated/{size}", self.truncated)
        app.router.add_route("*", "/api/v1/watch/{tail:.*}", self.watch)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        return app

    async def echo(self, request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        size = 0
        async for chunk in request.content.iter_chunked(65536):
            digest.update(chunk)
            size += len(chunk)
        record = {
            "method": request.method,
            "raw_path": request.raw_path,
            "headers": [(k, v) for k, v in request.headers.items()],
            "size": size,
            "sha256": digest.hexdigest(),
        }
        self.seen.append(record)
        return web.json_response(
            record, headers={"Connection": "keep-alive, X-Hop", "X-Hop": "secret", "X-Up": "yes"}
        )

    async def download(self, request: web.Request) -> web.StreamResponse:
        self.seen.append({"method": request.method, "raw_path": request.raw_path})
        size = int(request.match_info["size"])
        response = web.StreamResponse()
        response.content_length = size
        await response.prepare(request)
        block = b"x" * 65536
        sent = 0
        while sent < size:
            n = min(len(block), size - sent)
            await response.write(block[:n])
            sent += n
        await response.write_eof()
        return response

    async def truncated(self, request: web.Request) -> web.StreamResponse:
        """Promises `size` bytes, sends 10, then drops the connection."""
        self.seen.append({"method": request.method, "raw_path": request.raw_path})
        response = web.StreamResponse()
        response.content_length = int(request.match_info["size"])
        await response.prepare(request)
        await response.write(b"0123456789")
        assert request.transport is not None
        request.transport.abort()
        return response

    async def slow(self, request: web.Request) -> web.Response:
        self.seen.append({"method": request.method, "raw_path": request.raw_path})
        self.slow_arrived.set()
        await asyncio.sleep(self.slow_seconds)  # the behaviour under test: a slow upstream
        return web.json_response({"slow": True})

    async def watch(self, request: web.Request) -> web.StreamResponse:
        self.seen.append({"method": request.method, "raw_path": request.raw_path})
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(4):
            await response.write(json.dumps({"type": "ADDED", "i": i}).encode() + b"\n")
            await asyncio.sleep(0.8)  # the behaviour under test: a watch's pauses
        await response.write_eof()
        return response

    def headers_of(self, index: int = -1) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for k, v in self.seen[index]["headers"]:
            out.setdefault(k.lower(), []).append(v)
        return out


def sidecar_config(tmp: Path, upstream_url: str, **extra: Any) -> dict[str, Any]:
    tokens = processes.write_tokens(
        tmp,
        [
            {"token": "admin-token", "user": "admin", "tenant": "system", "groups": ["ops"]},
        ],
    )
    config: dict[str, Any] = {
        "upstream": upstream_url,
        "policies": str(FIXTURES / "allow_admin"),
        "identity": {"tokenFile": str(tokens)},
        "ledger": f"sqlite:///{tmp / 'ledger.db'}",
        "audit": {"path": str(tmp / "audit.log")},
        "reload": {"enabled": False},
    }
    for key, value in extra.items():
        config[key] = value
    return config


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, TestServer]]:
    up = Upstream()
    server = TestServer(up.app(), host="127.0.0.1")
    await server.start_server()
    yield up, server
    await server.close()


async def start_inprocess(tmp: Path, upstream_url: str, **extra: Any) -> TestServer:
    config = load_config(None, env={}, overrides={})
    raw = sidecar_config(tmp, upstream_url, **extra)
    raw.setdefault("apiPolicy", {"enabled": False})  # the fake upstream holds no policy objects
    path = processes.write_config(tmp, raw)
    config = load_config(path, env={})
    server = TestServer(build_app(config), host="127.0.0.1")
    await server.start_server()
    return server


@pytest.fixture
async def sidecar(
    tmp_path: Path, upstream: tuple[Upstream, TestServer]
) -> AsyncIterator[TestServer]:
    _, up_server = upstream
    server = await start_inprocess(
        tmp_path,
        str(up_server.make_url("")).rstrip("/"),
        limits={"upstreamReadTimeout": 1.0, "maxBodyBytes": 1 * MiB},
    )
    yield server
    await server.close()


def url(server: TestServer, raw: str) -> str:
    return f"http://127.0.0.1:{server.port}{raw}"


async def raw_request(port: int | None, data: bytes, read_timeout: float = 5.0) -> bytes:
    """Send bytes as-is (for targets aiohttp's client would normalise) and read the reply.
    `port` is a TestServer's (None only before it starts)."""
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        reply = await asyncio.wait_for(reader.read(65536), read_timeout)
    finally:
        writer.close()
    return reply


def status_body(reply: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = reply.partition(b"\r\n\r\n")
    code = int(head.split(b" ")[1])
    return code, json.loads(body) if body.strip() else {}


NS = "/api/v1/tenants/acme/namespaces/dev/events"  # not quota-tracked: bodies stream


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
async def test_every_method_forwarded(
    method: str, sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    body = b'{"metadata": {"name": "c1"}}' if method in ("POST", "PUT", "PATCH") else None
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url(sidecar, f"{NS}/c1"), data=body, headers=ADMIN) as r:
            assert r.status == 200
            if method != "HEAD":
                got = await r.json()
                assert got["method"] == method
                assert got["size"] == (len(body) if body else 0)
    assert up.seen[-1]["method"] == method


async def test_target_forwarded_as_parsed_encoded_slash_kept(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    """DESIGN §8: the target is rebuilt from its parse (canonical encoding), `%2F`
    stays inside its segment, a parameter no decision reads may repeat."""
    up, _ = upstream
    raw = f"{NS}/a%2Fb%2fc?x=1&x=2&y=%2F&x=3&empty="
    forwarded = f"{NS}/a%2Fb%2Fc?x=1&x=2&y=%2F&x=3&empty="
    request = (
        f"GET {raw} HTTP/1.1\r\nHost: example\r\nAuthorization: Bearer admin-token\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    reply = await raw_request(sidecar.port, request)
    code, body = status_body(reply)
    assert code == 200, reply
    assert body["raw_path"] == forwarded
    assert up.seen[-1]["raw_path"] == forwarded


async def test_headers_rewritten(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    headers = {
        **ADMIN,
        "Connection": "keep-alive, X-Drop-Me",
        "X-Drop-Me": "1",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Upgrade": "h2c",
        "Proxy-Authorization": "Basic x",
        "X-Remote-User": "mallory",
        "X-Remote-Tenant": "beta",
        "X-Remote-Group": "system:masters",
        "X-Forwarded-For": "10.9.9.9",
        "X-Request-Id": "req-123",
        "X-Custom": "kept",
    }
    async with aiohttp.ClientSession() as s:
        async with s.get(url(sidecar, f"{NS}/c1"), headers=headers) as r:
            assert r.status == 200
            assert r.headers["X-Request-Id"] == "req-123"
            assert r.headers["X-Up"] == "yes"
            assert "X-Hop" not in r.headers  # listed in the upstream's Connection header
    seen = up.headers_of()
    for hop in ("x-drop-me", "keep-alive", "te", "upgrade", "proxy-authorization"):
        assert hop not in seen, hop
    assert seen["x-custom"] == ["kept"]
    assert seen["x-request-id"] == ["req-123"]
    assert seen["x-forwarded-for"] == ["10.9.9.9, 127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["http"]
    assert seen["x-forwarded-host"] == [f"127.0.0.1:{sidecar.port}"]
    # Identity headers are the sidecar's own, never the client's.
    assert seen["x-remote-user"] == ["admin"]
    assert seen["x-remote-tenant"] == ["system"]
    assert seen["x-remote-group"] == ["ops"]
    assert seen["authorization"] == ["Bearer admin-token"]


async def test_request_id_generated_when_missing_or_bad(sidecar: TestServer) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(url(sidecar, f"{NS}/c1"), headers=ADMIN) as r:
            generated = r.headers["X-Request-Id"]
            assert len(generated) == 32
        bad = {**ADMIN, "X-Request-Id": "has spaces and \u00e9"}
        async with s.get(url(sidecar, f"{NS}/c1"), headers=bad) as r:
            assert r.headers["X-Request-Id"] != bad["X-Request-Id"]
            assert len(r.headers["X-Request-Id"]) == 32


BAD_TARGETS = [
    ("/api/v1/tenants/acme/namespaces/../pods", 400),
    ("/api/v1/tenants/acme/namespaces/%2e%2E/pods", 400),
    ("/api/v1/tenants/acme/namespaces/%2E/pods", 400),
    ("/api/v1//pods", 400),
    ("/api/v1/nodes/%zz", 400),
    ("/api/v1/nodes/%ff", 400),
    ("/api/v1/tenants/ACME/pods", 400),
    ("/api/v1/tenants/" + "a" * 64 + "/pods", 400),
    ("/api/v1/tenants/acme/namespaces/" + "n" * 64 + "/pods", 400),
    ("/api/v1/nodes/" + "x" * 254, 400),
]


@pytest.mark.parametrize(("target", "code"), BAD_TARGETS)
async def test_bad_targets_get_status_and_are_not_forwarded(
    target: str, code: int, sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    request = (
        f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    got, body = status_body(await raw_request(sidecar.port, request))
    assert got == code
    assert body["kind"] == "Status"
    assert body["code"] == code
    assert body["status"] == "Failure"
    assert body["reason"] == "BadRequest"
    assert up.seen == []


async def test_non_utf8_bytes_in_path(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    request = (
        b"GET /api/v1/nodes/\xff\xfe HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer admin-token\r\nConnection: close\r\n\r\n"
    )
    reply = await raw_request(sidecar.port, request)
    code = int(reply.split(b" ")[1])
    assert 400 <= code < 500
    assert up.seen == []


async def test_unknown_method(sidecar: TestServer, upstream: tuple[Upstream, TestServer]) -> None:
    up, _ = upstream
    request = (
        f"BREW {NS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    code, body = status_body(await raw_request(sidecar.port, request))
    assert code == 405
    assert body["reason"] == "MethodNotAllowed"
    assert up.seen == []


async def test_oversized_headers(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    async with aiohttp.ClientSession() as s:
        big = {**ADMIN, **{f"X-Pad-{i}": "p" * 4000 for i in range(10)}}
        async with s.get(url(sidecar, f"{NS}/c1"), headers=big) as r:
            assert r.status == 431
            body = await r.json()
            assert body["kind"] == "Status"
            assert body["code"] == 431
    assert up.seen == []


async def test_body_over_limit_by_content_length(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    async with aiohttp.ClientSession() as s:
        async with s.put(url(sidecar, f"{NS}/c1"), data=b"x" * (MiB + 1), headers=ADMIN) as r:
            assert r.status == 413
            body = await r.json()
            assert body["reason"] == "RequestEntityTooLarge"
    assert up.seen == []


async def test_body_over_limit_while_streaming(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"y" * 65536  # 2.5 MiB, chunked: no Content-Length

    async with aiohttp.ClientSession() as s:
        async with s.put(url(sidecar, f"{NS}/c1"), data=chunks(), headers=ADMIN) as r:
            assert r.status == 413
            body = await r.json()
            assert body["reason"] == "RequestEntityTooLarge"
        async with s.get(url(sidecar, "/healthz")) as r:
            assert r.status == 200


async def test_upstream_refused_is_502(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    server = await start_inprocess(tmp_path, f"http://127.0.0.1:{dead_port}")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url(server, f"{NS}/c1"), headers=ADMIN) as r:
                assert r.status == 502
                body = await r.json()
                assert body["kind"] == "Status"
                assert "unreachable" in body["message"]
            async with s.get(url(server, "/readyz")) as r:
                assert r.status == 503
                ready = await r.json()
                assert ready["checks"]["upstream"]["ok"] is False
    finally:
        await server.close()


async def test_upstream_dying_mid_small_answer_is_502(sidecar: TestServer) -> None:
    # A small answer is read whole before anything is sent: the client gets a Status.
    async with aiohttp.ClientSession() as s:
        async with s.get(url(sidecar, "/truncated/1000"), headers=ADMIN) as r:
            assert r.status == 502
            body = await r.json()
            assert body["kind"] == "Status"
            assert "mid-answer" in body["message"]
        async with s.get(url(sidecar, "/healthz")) as r:
            assert r.status == 200


async def test_upstream_dying_mid_large_answer_cuts_the_connection(sidecar: TestServer) -> None:
    # A large answer is already streaming: the sidecar can only cut the connection.
    async with aiohttp.ClientSession() as s:
        async with s.get(url(sidecar, "/truncated/1000000"), headers=ADMIN) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        async with s.get(url(sidecar, "/healthz")) as r:
            assert r.status == 200


async def test_upstream_too_slow_is_504(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    up.slow_seconds = 3.0  # the sidecar's read timeout is 1 s
    async with aiohttp.ClientSession() as s:
        async with s.get(url(sidecar, "/slow"), headers=ADMIN) as r:
            assert r.status == 504
            body = await r.json()
            assert body["reason"] == "Timeout"


async def test_watch_streams_past_the_read_timeout(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    # Events arrive 0.8 s apart over ~3.2 s; the read timeout is 1 s in total.
    events = []
    arrival = []
    async with aiohttp.ClientSession() as s:
        async with s.get(
            url(sidecar, "/api/v1/watch/tenants/acme/namespaces/dev/pods"), headers=ADMIN
        ) as r:
            assert r.status == 200
            async for line in r.content:
                if line.strip():
                    events.append(json.loads(line))
                    arrival.append(time.monotonic())
    assert [e["i"] for e in events] == [0, 1, 2, 3]
    # Streamed, not buffered: the first event came well before the last.
    assert arrival[-1] - arrival[0] > 1.5


async def test_readyz_healthz_metrics(
    sidecar: TestServer, upstream: tuple[Upstream, TestServer]
) -> None:
    up, _ = upstream
    async with aiohttp.ClientSession() as s:
        async with s.get(url(sidecar, "/healthz")) as r:
            assert r.status == 200
        async with s.get(url(sidecar, "/readyz")) as r:
            assert r.status == 200
            body = await r.json()
            assert body["ready"] is True
            assert body["checks"]["upstream"]["ok"] is True
        async with s.get(url(sidecar, f"{NS}/c1"), headers=ADMIN) as r:
            assert r.status == 200
        async with s.get(url(sidecar, "/metrics")) as r:
            assert r.status == 401  # names tenants: authorized like any URL (DESIGN §9)
        async with s.get(url(sidecar, "/metrics"), headers=ADMIN) as r:
            text = await r.text()
    assert 'sidecar_requests_total{code="200",decision=' in text
    assert 'tenant="system"' in text
    assert "sidecar_request_duration_seconds_bucket" in text
    assert "sidecar_requests_in_flight" in text
    # health endpoints never reach the upstream
    assert all(
        rec["raw_path"] != "/healthz" or rec.get("method") != "GET" or False
        for rec in up.seen
        if rec["raw_path"] in ("/metrics", "/readyz")
    )
    assert not any(rec["raw_path"] in ("/metrics", "/readyz") for rec in up.seen)


async def test_client_disconnect_mid_download_leaves_sidecar_healthy(
    sidecar: TestServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.port)
    writer.write(
        b"GET /download/30000000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n\r\n"
    )
    await writer.drain()
    await reader.read(100000)
    writer.transport.abort()
    # and mid-upload
    _reader2, writer2 = await asyncio.open_connection("127.0.0.1", sidecar.port)
    writer2.write(
        f"PUT {NS}/c1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n"
        "Content-Length: 900000\r\n\r\n".encode()
        + b"z" * 1000
    )
    await writer2.drain()
    writer2.transport.abort()
    assert sidecar.runner is not None
    assert sidecar.runner.server is not None
    server = sidecar.runner.server
    await eventually(lambda: not server.connections, what="both aborted connections handled")
    async with aiohttp.ClientSession() as s:
        async with s.get(url(sidecar, "/healthz")) as r:
            assert r.status == 200
        async with s.get(url(sidecar, f"{NS}/c1"), headers=ADMIN) as r:
            assert r.status == 200


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_50mib_upload_and_download_stream_without_buffering(
    tmp_path: Path, upstream: tuple[Upstream, TestServer]
) -> None:
    _up, up_server = upstream
    config = sidecar_config(
        tmp_path, str(up_server.make_url("")).rstrip("/"), limits={"maxBodyBytes": 200 * MiB}
    )
    proc = await asyncio.to_thread(processes.start_sidecar, tmp_path, config)
    try:
        base = proc.url
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}{NS}/warm", headers=ADMIN) as r:
                assert r.status == 200
            before = _rss_kib(proc.pid)
            size = 50 * MiB
            digest = hashlib.sha256()

            async def upload() -> AsyncIterator[bytes]:
                block = os.urandom(65536)
                for _ in range(size // 65536):
                    digest.update(block)
                    yield block

            async with s.put(f"{base}{NS}/big", data=upload(), headers=ADMIN) as r:
                assert r.status == 200
                got = await r.json()
            assert got["size"] == size
            assert got["sha256"] == digest.hexdigest()
            received = 0
            async with s.get(f"{base}/download/{size}", headers=ADMIN) as r:
                assert r.status == 200
                async for chunk in r.content.iter_chunked(65536):
                    received += len(chunk)
            assert received == size
            after = _rss_kib(proc.pid)
        growth_mib = (after - before) / 1024
        print(f"sidecar RSS before {before} KiB, after 2x50 MiB {after} KiB")
        assert growth_mib < 25, f"RSS grew by {growth_mib:.1f} MiB while streaming 50 MiB"
    finally:
        proc.stop()


async def test_sigterm_lets_a_request_in_flight_finish(
    tmp_path: Path, upstream: tuple[Upstream, TestServer]
) -> None:
    up, up_server = upstream
    up.slow_seconds = 1.5
    config = sidecar_config(tmp_path, str(up_server.make_url("")).rstrip("/"))
    proc = await asyncio.to_thread(processes.start_sidecar, tmp_path, config)
    try:
        async with aiohttp.ClientSession() as s:
            pending = asyncio.ensure_future(s.get(f"{proc.url}/slow", headers=ADMIN))
            await asyncio.wait_for(up.slow_arrived.wait(), 10)  # in flight at the upstream
            proc.proc.send_signal(signal.SIGTERM)
            r = await pending
            assert r.status == 200
            assert await r.json() == {"slow": True}
            r.release()
        code = await asyncio.to_thread(proc.proc.wait, 10)
        assert code == 0
    finally:
        proc.stop()

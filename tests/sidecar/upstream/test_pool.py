"""The lean upstream pool (sidecar/upstream/pool.py) against a strict raw upstream: what
it must get right so that no byte of one exchange is ever read as part of another."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from sidecar.upstream.pool import (
    HIGH_WATER,
    UpstreamBroken,
    UpstreamPool,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from tests.rigs.processes import free_port
from tests.rigs.raw_http import Message, RawUpstream, Responder, response_bytes
from tests.rigs.waiting import eventually


@contextlib.contextmanager
def upstream_with(responder: Responder) -> Iterator[RawUpstream]:
    raw = RawUpstream(responder=responder).start()
    try:
        yield raw
    finally:
        raw.stop()


async def answer(writer: asyncio.StreamWriter, data: bytes, keep: bool = True) -> bool:
    writer.write(data)
    await writer.drain()
    return keep


async def echo_target(msg: Message, writer: asyncio.StreamWriter) -> bool:
    """200 with the request's target, method and body as the body."""
    body = f"{msg.method} {msg.target} ".encode() + msg.body
    return await answer(writer, response_bytes(200, body))


@pytest.fixture
def echo() -> Iterator[RawUpstream]:
    with upstream_with(echo_target) as raw:
        yield raw


async def get(
    pool: UpstreamPool, target: str, method: str = "GET", body: bytes | None = None
) -> tuple[int, bytes]:
    resp = await pool.request(method, target, [("Accept", "*/*")], body)
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


async def test_keep_alive_reuses_one_connection(echo: RawUpstream) -> None:
    pool = UpstreamPool(echo.url, 4, 5)
    for i in range(5):
        assert await get(pool, f"/x/{i}?q={i}") == (200, f"GET /x/{i}?q={i} ".encode())
    assert echo.connections == 1
    assert pool.open_connections == 1
    await pool.close()


async def test_bodies_bytes_stream_and_chunked_arrive_exactly(echo: RawUpstream) -> None:
    pool = UpstreamPool(echo.url, 4, 5)
    assert await get(pool, "/b", "POST", b"abc") == (200, b"POST /b abc")
    assert await get(pool, "/e", "POST") == (200, b"POST /e ")

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"12", b"", b"345"):
            yield part

    resp = await pool.request("PUT", "/s", [], parts(), 5)
    assert (resp.status, await resp.read()) == (200, b"PUT /s 12345")
    resp.release()
    resp = await pool.request("PUT", "/c", [], parts())
    assert (resp.status, await resp.read()) == (200, b"PUT /c 12345")
    resp.release()
    received, errors = echo.snapshot()
    assert errors == []
    assert [m.header("Content-Length") for m in received] == ["3", "0", "5", None]
    assert received[3].chunked
    assert received[0].header("Host") == f"127.0.0.1:{echo.port}"
    assert echo.connections == 1
    await pool.close()


async def test_interim_100_is_skipped_and_the_connection_stays_in_sync() -> None:
    async def with_continue(msg: Message, writer: asyncio.StreamWriter) -> bool:
        interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: x\r\n\r\n"
        return await answer(writer, interim + response_bytes(201, msg.target.encode()))

    with upstream_with(with_continue) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        assert await get(pool, "/one") == (201, b"/one")
        assert await get(pool, "/two") == (201, b"/two")
        assert raw.connections == 1
        await pool.close()


async def test_101_is_a_broken_exchange_and_the_connection_is_dropped() -> None:
    async def upgrade(msg: Message, writer: asyncio.StreamWriter) -> bool:
        if msg.target == "/up":
            data = (
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nzz"
            )
            return await answer(writer, data)
        return await echo_target(msg, writer)

    with upstream_with(upgrade) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        with pytest.raises(UpstreamBroken, match="switched"):
            await pool.request("GET", "/up", [])
        assert await get(pool, "/after") == (200, b"GET /after ")
        assert raw.connections == 2
        await pool.close()


async def test_head_answer_ends_at_its_headers() -> None:
    async def head(msg: Message, writer: asyncio.StreamWriter) -> bool:
        if msg.method == "HEAD":
            return await answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
        return await echo_target(msg, writer)

    with upstream_with(head) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("HEAD", "/h", [])
        assert resp.status == 200
        assert resp.content_length == 1234
        assert await resp.read() == b""
        resp.release()
        assert await get(pool, "/next") == (200, b"GET /next ")
        assert raw.connections == 1
        await pool.close()


async def test_a_head_answer_followed_by_body_bytes_is_not_reused() -> None:
    async def head(msg: Message, writer: asyncio.StreamWriter) -> bool:
        if msg.method == "HEAD":
            # A broken upstream: the body of a HEAD answer, which would otherwise be
            # read as the start of the next answer.
            data = response_bytes(200, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
            return await answer(writer, data)
        return await echo_target(msg, writer)

    with upstream_with(head) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("HEAD", "/h", [])
        await resp.read()
        await asyncio.sleep(0)  # the bytes after the headers may come in a later read
        resp.release()
        for i in range(3):
            assert await get(pool, f"/n{i}") == (200, f"GET /n{i} ".encode())
        assert raw.connections >= 2
        await pool.close()


async def test_204_and_304_have_no_body_whatever_their_headers_say() -> None:
    async def empty(msg: Message, writer: asyncio.StreamWriter) -> bool:
        status = 204 if msg.target == "/204" else 304
        data = f"HTTP/1.1 {status} X\r\nContent-Length: 10\r\n\r\n".encode()
        return await answer(writer, data)

    with upstream_with(empty) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        assert await get(pool, "/204") == (204, b"")
        assert await get(pool, "/304") == (304, b"")
        assert raw.connections == 1
        await pool.close()


async def test_close_delimited_body_is_read_to_the_end_and_not_reused() -> None:
    async def until_close(msg: Message, writer: asyncio.StreamWriter) -> bool:
        return await answer(writer, b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 100_000, keep=False)

    with upstream_with(until_close) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        assert await get(pool, "/a") == (200, b"x" * 100_000)
        assert await get(pool, "/b") == (200, b"x" * 100_000)
        assert raw.connections == 2
        assert pool.idle_connections == 0
        await pool.close()


async def test_chunked_answer_with_trailers() -> None:
    async def chunked(msg: Message, writer: asyncio.StreamWriter) -> bool:
        data = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Checksum: 1\r\n\r\n"
        )
        return await answer(writer, data)

    with upstream_with(chunked) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("GET", "/c", [])
        assert await resp.read() == b"abcde"
        assert "X-Checksum" not in resp.headers
        resp.release()
        assert await get(pool, "/c") == (200, b"abcde")
        assert raw.connections == 1
        await pool.close()


@pytest.mark.parametrize(
    "smuggled",
    [response_bytes(200, b"SMUGGLED"), b"HTTP/1.1 204 No Content\r\n\r\n"],
    ids=["with-body", "bodiless"],
)
async def test_bytes_after_a_complete_answer_end_the_connection(smuggled: bytes) -> None:
    async def smuggler(msg: Message, writer: asyncio.StreamWriter) -> bool:
        return await answer(writer, response_bytes(200, msg.target.encode()) + smuggled)

    with upstream_with(smuggler) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        for i in range(4):
            assert await get(pool, f"/{i}") == (200, f"/{i}".encode())
        assert raw.connections == 4
        await pool.close()


async def test_bytes_while_idle_end_the_connection() -> None:
    sent = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def late(msg: Message, writer: asyncio.StreamWriter) -> bool:
        await answer(writer, response_bytes(200, msg.target.encode()))
        if msg.target == "/first":
            await asyncio.sleep(0.05)  # the behaviour under test: bytes after idling
            await answer(writer, response_bytes(200, b"LATE"))
            loop.call_soon_threadsafe(sent.set)
        return True

    with upstream_with(late) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        assert await get(pool, "/first") == (200, b"/first")
        await sent.wait()
        await eventually(lambda: pool.idle_connections == 0, what="the idle connection closed")
        assert await get(pool, "/second") == (200, b"/second")
        assert raw.connections == 2
        await pool.close()


def answers_once_per_connection() -> Responder:
    """Answers the first request of each connection (keep-alive), then closes the
    connection on the next one without answering: a connection the upstream dropped
    while the pool held it."""
    seen: set[int] = set()

    async def once(msg: Message, writer: asyncio.StreamWriter) -> bool:
        if id(writer) in seen:
            return False
        seen.add(id(writer))
        return await answer(writer, response_bytes(200, msg.target.encode()))

    return once


async def test_an_idempotent_request_is_retried_once_on_a_reused_dead_connection() -> None:
    with upstream_with(answers_once_per_connection()) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        assert await get(pool, "/1") == (200, b"/1")
        assert await get(pool, "/2") == (200, b"/2")  # the pooled one died unanswered
        received, _ = raw.snapshot()
        assert [m.target for m in received] == ["/1", "/2", "/2"]
        assert raw.connections == 2
        await pool.close()


async def test_a_post_is_never_retried() -> None:
    with upstream_with(answers_once_per_connection()) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        assert await get(pool, "/1") == (200, b"/1")
        with pytest.raises(UpstreamBroken):
            await pool.request("POST", "/create", [], b"{}")
        received, _ = raw.snapshot()
        assert [m.target for m in received] == ["/1", "/create"]
        assert await get(pool, "/3", "POST", b"{}") == (200, b"/3")
        await pool.close()


async def test_an_answer_cut_short_raises_and_is_not_reused() -> None:
    async def cut(msg: Message, writer: asyncio.StreamWriter) -> bool:
        if msg.target == "/cut":
            return await answer(
                writer, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", False
            )
        return await echo_target(msg, writer)

    with upstream_with(cut) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("GET", "/cut", [])
        with pytest.raises(UpstreamBroken):
            await resp.read()
        resp.release()
        assert await get(pool, "/ok") == (200, b"GET /ok ")
        await pool.close()


async def test_garbage_is_a_broken_exchange() -> None:
    async def garbage(msg: Message, writer: asyncio.StreamWriter) -> bool:
        return await answer(
            writer, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"
        )

    with upstream_with(garbage) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        with pytest.raises(UpstreamBroken, match="not valid HTTP"):
            await pool.request("GET", "/", [])
        assert pool.open_connections == 0
        await pool.close()


async def test_a_cancelled_exchange_closes_its_connection() -> None:
    release = threading.Event()

    async def slow(msg: Message, writer: asyncio.StreamWriter) -> bool:
        if msg.target == "/slow":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()
            await asyncio.to_thread(release.wait, 10)  # holds the rest of the body back
            return await answer(writer, b"defghij")
        return await echo_target(msg, writer)

    with upstream_with(slow) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("GET", "/slow", [])
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await resp.read()
        resp.release()
        release.set()
        assert await get(pool, "/after") == (200, b"GET /after ")
        assert raw.connections == 2
        await pool.close()


async def test_the_pool_never_opens_more_than_its_size() -> None:
    in_flight = 0
    most = 0

    async def counted(msg: Message, writer: asyncio.StreamWriter) -> bool:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02)  # keeps requests overlapping
        in_flight -= 1
        return await echo_target(msg, writer)

    with upstream_with(counted) as raw:
        pool = UpstreamPool(raw.url, 2, 5)
        results = await asyncio.gather(*(get(pool, f"/{i}") for i in range(8)))
        assert [r[1] for r in results] == [f"GET /{i} ".encode() for i in range(8)]
        assert most <= 2
        assert raw.connections == 2
        await pool.close()


@pytest.mark.parametrize("value", ["a\r\nX-Remote-User: admin", "a\nb", "a\rb", "a\0b"])
async def test_control_characters_in_headers_are_refused_before_sending(
    echo: RawUpstream, value: str
) -> None:
    pool = UpstreamPool(echo.url, 4, 5)
    with pytest.raises(ValueError, match=r"CR or LF|NUL"):
        await pool.request("GET", "/", [("X-Remote-Group", value)])
    assert echo.connections == 0
    await pool.close()


async def test_unreachable_upstream() -> None:
    pool = UpstreamPool(f"http://127.0.0.1:{free_port()}", 4, 5)
    with pytest.raises(UpstreamUnreachable):
        await pool.request("GET", "/", [])
    assert pool.open_connections == 0
    await pool.close()


async def test_a_slow_reader_pauses_the_upstream_socket() -> None:
    big = b"y" * (8 * HIGH_WATER)

    async def large(msg: Message, writer: asyncio.StreamWriter) -> bool:
        return await answer(writer, response_bytes(200, big))

    with upstream_with(large) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("GET", "/big", [])
        # Not reading: the socket is paused once the high-water mark is passed, and
        # what is buffered stays near it (one socket read more at most).
        await eventually(lambda: resp._conn._read_paused, what="reading paused")
        assert resp._size <= HIGH_WATER + 256 * 1024
        assert await resp.read() == big
        resp.release()
        assert await get(pool, "/again") == (200, big)
        assert raw.connections == 1
        await pool.close()


async def test_the_upstream_url_path_prefixes_every_target() -> None:
    async def target(msg: Message, writer: asyncio.StreamWriter) -> bool:
        return await answer(writer, response_bytes(200, msg.target.encode()))

    with upstream_with(target) as raw:
        pool = UpstreamPool(raw.url + "/base/", 4, 5)
        assert await get(pool, "/x?y=1") == (200, b"/base/x?y=1")
        await pool.close()


async def test_utf8_header_values_arrive_as_the_same_text() -> None:
    async def utf8(msg: Message, writer: asyncio.StreamWriter) -> bool:
        head = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Name: café ✓\r\n\r\n"
        return await answer(writer, head.encode())

    with upstream_with(utf8) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("GET", "/", [])
        assert resp.headers["X-Name"] == "café ✓"
        resp.release()
        await pool.close()


def holding(release: threading.Event, first: bytes = b"") -> Responder:
    """Sends `first` (nothing: not even headers), then holds the rest of the answer
    back until `release` is set; then a complete answer."""

    async def held(msg: Message, writer: asyncio.StreamWriter) -> bool:
        if msg.target.startswith("/held"):
            if first:
                writer.write(first)
                await writer.drain()
            await asyncio.to_thread(release.wait, 10)  # the behaviour under test
            return await answer(writer, b"abc" if first else response_bytes(200, b"late"))
        return await echo_target(msg, writer)

    return held


async def test_a_deadline_times_out_waiting_for_headers_and_drops_the_connection() -> None:
    release = threading.Event()
    with upstream_with(holding(release)) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        with pytest.raises(UpstreamTimeout):
            await pool.request("GET", "/held", [], within=0.2)
        release.set()  # the late answer goes to a closed connection
        assert await get(pool, "/after") == (200, b"GET /after ")
        assert raw.connections == 2
        await pool.close()


async def test_a_deadline_covers_the_body_until_release_and_not_after_disarm() -> None:
    release = threading.Event()
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nxyz"
    with upstream_with(holding(release, first)) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        resp = await pool.request("GET", "/held-1", [], within=0.2)
        with pytest.raises(UpstreamTimeout):
            await resp.read()
        resp.release()
        resp = await pool.request("GET", "/held-2", [], within=0.2)
        resp.disarm()
        reader = asyncio.ensure_future(resp.read())
        await asyncio.sleep(0.4)  # the behaviour under test: past the disarmed deadline
        assert not reader.done()
        release.set()
        assert await reader == b"xyzabc"
        resp.release()
        await pool.close()


async def test_a_deadline_ends_a_stalled_streamed_body_and_leaves_the_task_usable() -> None:
    stalled = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b"part"
        await stalled.wait()  # a client that stopped sending its body
        yield b"never"

    with upstream_with(echo_target) as raw:
        pool = UpstreamPool(raw.url, 4, 5)
        with pytest.raises(UpstreamTimeout):
            await pool.request("POST", "/slow-body", [], body(), 9, within=0.2)
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
        await asyncio.sleep(0)  # the task is not cancelled: awaiting works
        assert await get(pool, "/after") == (200, b"GET /after ")
        await pool.close()


async def test_waiting_for_a_connection_counts_against_the_deadline() -> None:
    release = threading.Event()
    with upstream_with(holding(release)) as raw:
        pool = UpstreamPool(raw.url, 1, 5)
        holder = asyncio.ensure_future(pool.request("GET", "/held", []))
        await eventually(lambda: pool.open_connections == 1, what="the only connection taken")
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/waits", [], within=0.2)
        release.set()
        resp = await holder
        assert await resp.read() == b"late"
        resp.release()
        assert await get(pool, "/after") == (200, b"GET /after ")
        await pool.close()


async def test_idle_connections_are_closed_at_the_idle_limit(echo: RawUpstream) -> None:
    """Found by fault injection (issue 29): after an upstream stall, 144 idle
    connections stayed open, since idleness was checked only when a connection was
    handed out. The pool's reaper closes each at its idle limit, not before, and stops
    when nothing is idle."""
    pool = UpstreamPool(echo.url, 16, 5, idle_seconds=0.3)
    loop = asyncio.get_running_loop()
    answers = await asyncio.gather(*(get(pool, f"/burst/{i}") for i in range(5)))
    went_idle = loop.time()
    assert [status for status, _ in answers] == [200] * 5
    assert echo.connections == 5
    assert pool.idle_connections == 5
    await eventually(lambda: pool.open_connections == 0, what="the idle connections closed")
    assert loop.time() - went_idle >= 0.3
    assert pool.idle_connections == 0
    await eventually(lambda: pool._reaper is not None and pool._reaper.done(), what="reaper done")
    # A connection used again in the meantime starts its idle time anew.
    assert await get(pool, "/again") == (200, b"GET /again ")
    first = loop.time()
    await asyncio.sleep(0.2)  # the behaviour under test: a reuse before the limit
    assert await get(pool, "/reused") == (200, b"GET /reused ")
    assert echo.connections == 6
    await eventually(lambda: pool.open_connections == 0, what="the reused one closed")
    assert loop.time() - first >= 0.5
    await pool.close()

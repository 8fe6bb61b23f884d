"""Upstream faults on the sidecar's pooled connections (issue 15, DESIGN §8): each fault
gets its status (504 slow, 502 reset or unanswered, 413 oversized body, a cut
connection mid-answer), and no fault ever leaves a pooled connection in a state where
the next request on it is read wrongly. The pool has ONE connection, so every request
after a fault would be sent on the faulted connection if it were kept: a late answer,
smuggled bytes or half a body would then be read as the next client's answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.upstream.pool import IDLE_SECONDS
from tests.rigs import processes
from tests.rigs.raw_http import (
    ADMIN_TOKEN,
    Message,
    RawUpstream,
    exchange,
    request_bytes,
    response_bytes,
    sidecar_config,
)
from tests.rigs.relay import RecordingRelay
from tests.rigs.waiting import eventually

EVENTS = "/api/v1/tenants/acme/namespaces/dev/events"
READ_TIMEOUT = 0.5
MAX_BODY = 1000


async def _scripted(msg: Message, writer: asyncio.StreamWriter) -> bool:
    name = msg.target.rsplit("/", 1)[-1].split("?")[0]
    own = json.dumps({"target": msg.target}).encode()
    if name == "late":
        # The behaviour under test: an answer after the sidecar gave up (504). Sent on
        # the same connection, it would be the next request's answer if it were kept.
        await asyncio.sleep(READ_TIMEOUT * 2)
        writer.write(response_bytes(200, b'{"target":"LATE"}'))
    elif name == "smuggle":
        writer.write(response_bytes(200, own) + response_bytes(200, b'{"target":"SMUGGLED"}'))
    elif name == "cut":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"target":"HALF')
        await writer.drain()
        return False
    elif name == "unanswered":
        return False
    elif name == "garbage":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef")
    else:
        writer.write(response_bytes(200, own))
    await writer.drain()
    return True


@pytest.fixture(scope="module")
def one_connection(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RawUpstream, int]]:
    tmp = tmp_path_factory.mktemp("pool-faults")
    upstream = RawUpstream(responder=_scripted).start()
    limits = {
        "maxBodyBytes": MAX_BODY,
        "upstreamReadTimeout": READ_TIMEOUT,
        "upstreamPoolSize": 1,
    }
    proc = processes.start_sidecar(tmp, sidecar_config(tmp, upstream.url, limits=limits))
    yield upstream, proc.port
    proc.stop()
    upstream.stop()


async def _get(port: int, name: str) -> tuple[int, bytes, bool]:
    answers, closed = await exchange(
        port,
        request_bytes("GET", f"{EVENTS}/{name}", [("Authorization", f"Bearer {ADMIN_TOKEN}")]),
        1,
    )
    if not answers:
        return 0, b"", closed
    return answers[0].status, answers[0].body, closed


async def _next_requests_read_their_own_answers(port: int) -> None:
    for i in range(3):
        status, body, _ = await _get(port, f"after-{i}")
        assert status == 200
        assert json.loads(body) == {"target": f"{EVENTS}/after-{i}"}


@pytest.mark.parametrize(
    ("fault", "statuses"),
    [
        ("late", {504}),
        ("smuggle", {200}),
        ("cut", {0, 200, 502}),  # a cut connection (the answer had started) or 502
        ("unanswered", {502}),
        ("garbage", {502}),
    ],
)
async def test_a_fault_answers_its_status_and_the_next_request_reads_its_own(
    one_connection: tuple[RawUpstream, int], fault: str, statuses: set[int]
) -> None:
    _, port = one_connection
    status, body, closed = await _get(port, fault)
    assert status in statuses, (status, body)
    if status == 200 and fault == "cut":
        assert closed  # never a short body presented as complete
    if fault == "smuggle":
        assert json.loads(body) == {"target": f"{EVENTS}/smuggle"}
    if status >= 400:
        assert json.loads(body)["kind"] == "Status"
    await _next_requests_read_their_own_answers(port)


async def test_an_oversized_streamed_body_is_413_and_its_connection_is_not_reused(
    one_connection: tuple[RawUpstream, int],
) -> None:
    upstream, port = one_connection
    headers = [("Authorization", f"Bearer {ADMIN_TOKEN}"), ("Content-Type", "application/json")]
    body = b"x" * (MAX_BODY + 500)
    wire = request_bytes("POST", EVENTS, headers, body, chunks=list(range(100, len(body), 100)))
    answers, _ = await exchange(port, wire, 1)
    assert [a.status for a in answers] == [413]
    assert json.loads(answers[0].body)["reason"] == "RequestEntityTooLarge"
    await _next_requests_read_their_own_answers(port)
    received, errors = upstream.snapshot()
    assert errors == []  # nothing the upstream parsed was malformed
    assert not any(m.method == "POST" and len(m.body) > MAX_BODY for m in received)


BURST = 40


@pytest.mark.slow
async def test_idle_connections_after_a_store_stall_are_closed_at_the_idle_limit(
    tmp_path: Path,
) -> None:
    """Found by fault injection (issue 29): after a store stall, 144 idle upstream
    connections stayed open, since the pool looked at idleness only when it handed a
    connection out. The real store stalls (SIGSTOP) under a burst of reads through the
    real sidecar, so each read takes a connection of its own; once the store answers
    again, every one of them is idle, and the pool's reaper closes each at the idle
    limit (`IDLE_SECONDS`, 30 s), not before. A relay between the two counts the
    sidecar's connections."""
    store = await asyncio.to_thread(processes.start_store, tmp_path)
    relay = RecordingRelay(store.port)
    await relay.start()
    proc = None
    try:
        proc = await asyncio.to_thread(
            processes.start_sidecar, tmp_path, sidecar_config(tmp_path, relay.url)
        )
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def read(i: int) -> int:
                async with http.get(f"{proc.url}/api/v1/nodes/burst-{i}", headers=headers) as r:
                    await r.read()
                    return r.status

            os.kill(store.proc.pid, signal.SIGSTOP)
            try:
                reads = [asyncio.ensure_future(read(i)) for i in range(BURST)]
                await eventually(
                    lambda: relay.requests_with(b"burst-") == BURST,
                    what="every read waits on a connection of its own",
                )
            finally:
                os.kill(store.proc.pid, signal.SIGCONT)
            assert await asyncio.gather(*reads) == [404] * BURST
        idle_from = time.monotonic()
        burst = [link for link in relay.links if link.carried(b"burst-")]
        assert len(burst) == BURST
        assert all(not link.closed for link in burst)  # idle in the pool, all of them
        await eventually(
            lambda: all(link.closed for link in burst),
            within=IDLE_SECONDS + 15,
            what="the idle connections closed",
        )
        took = time.monotonic() - idle_from
        print(f"{BURST} idle upstream connections closed {took:.1f} s after they went idle")
        assert took >= IDLE_SECONDS - 1  # at the limit, not before
    finally:
        if proc is not None:
            proc.stop()
        await relay.stop()
        store.stop()

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
from collections.abc import Iterator

import pytest

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

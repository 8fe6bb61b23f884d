"""Request-body desync (issue 12 finding 1, DESIGN §8): a request body reaches the
upstream byte for byte with its own framing, never decompressed, and a `Connection`
header may not remove framing or identity headers. Real sidecar process, raw upstream
on pooled keep-alive connections."""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rigs import processes
from tests.rigs.raw_http import (
    ADMIN_TOKEN,
    RawUpstream,
    exchange,
    request_bytes,
    sidecar_config,
)

CONFIGMAP = "/api/v1/tenants/acme/namespaces/dev/events/e1"  # not quota-tracked
AUTH = ("Authorization", f"Bearer {ADMIN_TOKEN}")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[RawUpstream, processes.Proc]]:
    upstream = RawUpstream().start()
    proc = processes.start_sidecar(tmp_path, sidecar_config(tmp_path, upstream.url))
    yield upstream, proc
    proc.stop()
    upstream.stop()


def gzip_bodies() -> list[bytes]:
    """gzip bodies whose decompressed size is smaller (incompressible bytes) and larger
    (repetitive bytes) than their own length."""
    smaller = gzip.compress(random.Random(7).randbytes(3000))
    larger = gzip.compress(b'{"data":"' + b"a" * 5000 + b'"}')
    assert len(gzip.decompress(smaller)) < len(smaller)
    assert len(gzip.decompress(larger)) > len(larger)
    return [smaller, larger]


@pytest.mark.parametrize("which", [0, 1], ids=["shrinks", "grows"])
async def test_gzip_body_is_forwarded_compressed_with_its_own_length(
    which: int,
    stack: tuple[RawUpstream, processes.Proc],
) -> None:
    upstream, proc = stack
    compressed = gzip_bodies()[which]
    attack = request_bytes(
        "PUT",
        CONFIGMAP,
        [
            AUTH,
            ("Content-Type", "application/json"),
            ("Content-Encoding", "gzip"),
            ("X-Request-Id", "attack-1"),
        ],
        compressed,
    )
    answers, _ = await exchange(proc.port, attack, 1)
    assert [a.status for a in answers] == [200]
    # Another client's request on the (pooled) upstream connection arrives intact.
    follow = request_bytes("GET", CONFIGMAP, [AUTH, ("X-Request-Id", "follow-1")])
    answers, _ = await exchange(proc.port, follow, 1)
    assert [a.status for a in answers] == [200]

    received, errors = upstream.snapshot()
    # A decompressed body shorter than its Content-Length made the upstream read the
    # next client's request as the rest of the body.
    assert errors == []
    assert [m.method for m in received] == ["PUT", "GET"], [m.start for m in received]
    put = received[0]
    assert put.header("X-Request-Id") == "attack-1"
    assert put.body == compressed
    assert put.header("Content-Encoding") == "gzip"
    assert put.header("Content-Length") == str(len(compressed))
    assert received[1].header("X-Request-Id") == "follow-1"


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_compressed_chunked_body_is_not_decompressed(
    coding: str,
    stack: tuple[RawUpstream, processes.Proc],
) -> None:
    upstream, proc = stack
    plain = b'{"data":"' + b"z" * 50000 + b'"}'
    body = gzip.compress(plain) if coding == "gzip" else zlib.compress(plain)
    raw = request_bytes(
        "POST", CONFIGMAP, [AUTH, ("Content-Encoding", coding)], body, chunks=[7, 100, 101]
    )
    answers, _ = await exchange(proc.port, raw, 1)
    assert [a.status for a in answers] == [200]
    received, errors = upstream.snapshot()
    assert errors == []
    assert len(received) == 1
    assert received[0].body == body
    assert received[0].header("Content-Encoding") == coding


@pytest.mark.parametrize(
    "named",
    [
        "Content-Length",
        "content-encoding",
        "Content-Type",
        "Transfer-Encoding",
        "Host",
        "Authorization",
        "keep-alive, Content-Encoding",
        "X-Foo,  CONTENT-LENGTH ",
    ],
)
async def test_connection_may_not_name_framing_or_identity_headers(
    named: str,
    stack: tuple[RawUpstream, processes.Proc],
) -> None:
    upstream, proc = stack
    body = gzip.compress(b'{"a": 1}' * 100)
    raw = request_bytes(
        "PUT",
        CONFIGMAP,
        [
            AUTH,
            ("Content-Type", "application/json"),
            ("Content-Encoding", "gzip"),
            ("Connection", named),
        ],
        body,
    )
    answers, _ = await exchange(proc.port, raw, 1)
    assert len(answers) == 1
    answer = answers[0]
    assert answer.status == 400
    assert b'"kind": "Status"' in answer.body
    assert b"Connection" in answer.body
    received, errors = upstream.snapshot()
    assert received == []
    assert errors == []


async def test_hop_by_hop_names_in_connection_are_still_dropped(
    stack: tuple[RawUpstream, processes.Proc],
) -> None:
    upstream, proc = stack
    raw = request_bytes(
        "GET",
        CONFIGMAP,
        [AUTH, ("Connection", "keep-alive, X-Drop"), ("X-Drop", "1"), ("X-Keep", "2")],
    )
    answers, _ = await exchange(proc.port, raw, 1)
    assert [a.status for a in answers] == [200]
    received, _ = upstream.snapshot()
    assert received[0].header("X-Drop") is None
    assert received[0].header("X-Keep") == "2"

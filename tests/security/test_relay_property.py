"""The relay property (issue 12 finding 1, DESIGN §8), fuzzed: random bodies, content
encodings, `Connection` values, chunked and pipelined requests go over raw sockets
through the real sidecar process into a raw upstream that parses HTTP/1.1 strictly on
keep-alive connections. For every client request, either the upstream received exactly
that request with exactly its body bytes and Content-Encoding, or the sidecar refused
it with a 4xx; no upstream request is malformed, and none arrives that no client sent.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

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

MAX_BODY = 6000
EVENTS = "/api/v1/tenants/acme/namespaces/dev/events"
PODS = "/api/v1/tenants/acme/namespaces/dev/pods"  # quota-tracked: the sidecar reads it
SMUGGLE = b"\r\n\r\nDELETE /smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
_ids = itertools.count(1)


async def _echo(msg: Message, writer: asyncio.StreamWriter) -> bool:
    writer.write(response_bytes(200, b'{"metadata":{"name":"relayed"}}', {"X-Upstream": "1"}))
    await writer.drain()
    return True


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RawUpstream, int]]:
    tmp = tmp_path_factory.mktemp("relay")
    upstream = RawUpstream(responder=_echo).start()
    proc = processes.start_sidecar(
        tmp,
        sidecar_config(
            tmp, upstream.url, limits={"maxBodyBytes": MAX_BODY, "upstreamReadTimeout": 10}
        ),
    )
    yield upstream, proc.port
    proc.stop()
    upstream.stop()


@dataclass
class Sent:
    rid: str
    method: str
    target: str
    body: bytes | None
    encoding: str | None
    wire: bytes
    malformed: bool


def _encode(plain: bytes, kind: str) -> tuple[bytes, str | None]:
    if kind == "gzip":
        return gzip.compress(plain), "gzip"
    if kind == "deflate":
        return zlib.compress(plain), "deflate"
    if kind == "garbage-gzip":
        return plain, "gzip"  # says gzip, is not
    if kind == "br":
        return plain, "br"
    if kind == "identity":
        return plain, "identity"
    return plain, None


_plain = st.one_of(
    st.binary(max_size=2500),
    st.builds(lambda a, b: a + SMUGGLE + b, st.binary(max_size=300), st.binary(max_size=300)),
    st.builds(
        lambda n: b'{"metadata":{"name":"p"},"pad":"' + b"x" * n + b'"}', st.integers(0, 9000)
    ),
)
_request = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["POST", "PUT", "PATCH", "GET", "DELETE"]),
        "path": st.sampled_from([EVENTS + "/e1", EVENTS, PODS]),
        "plain": _plain,
        "coding": st.sampled_from(["none", "identity", "gzip", "deflate", "garbage-gzip", "br"]),
        "framing": st.sampled_from(
            ["length"] * 4
            + ["chunked"] * 4
            + ["none", "length+chunked", "two-lengths", "chunked-bad"]
        ),
        "cuts": st.lists(st.integers(1, 12000), max_size=5),
        "connection": st.sampled_from(
            [None] * 10
            + [
                "keep-alive",
                "close",
                "X-Foo",
                "X-Remote-User",
                "Expect",
                "keep-alive, Content-Encoding",
                "Content-Length",
                "transfer-encoding",
                "Host",
                "Authorization",
                "Content-Type",
            ]
        ),
        "ctype": st.sampled_from([None, "application/json", "application/octet-stream"]),
        "expect": st.booleans(),
        "remote": st.sampled_from([None, "X-Remote-User", "X_Remote_Tenant", "x-remote-group"]),
    }
)


def _build(spec: dict[str, Any]) -> Sent:
    rid = f"relay-{next(_ids)}"
    body, encoding = _encode(spec["plain"], spec["coding"])
    headers = [("Authorization", f"Bearer {ADMIN_TOKEN}"), ("X-Request-Id", rid)]
    if encoding:
        headers.append(("Content-Encoding", encoding))
    if spec["ctype"]:
        headers.append(("Content-Type", spec["ctype"]))
    if spec["connection"]:
        headers.append(("Connection", spec["connection"]))
    if spec["expect"]:
        headers.append(("Expect", "100-continue"))
    if spec["remote"]:
        headers.append((spec["remote"], "mallory"))
    framing = spec["framing"]
    malformed = False
    sent_body: bytes | None = body
    if framing == "none":
        wire = request_bytes(spec["method"], spec["path"], headers)
        sent_body = None
    elif framing == "length":
        wire = request_bytes(spec["method"], spec["path"], headers, body)
    elif framing == "chunked":
        wire = request_bytes(spec["method"], spec["path"], headers, body, chunks=spec["cuts"])
    elif framing == "length+chunked":
        malformed = True
        wire = request_bytes(
            spec["method"],
            spec["path"],
            [*headers, ("Content-Length", str(len(body)))],
            body,
            chunks=spec["cuts"],
        )
    elif framing == "two-lengths":
        malformed = True
        wire = request_bytes(
            spec["method"], spec["path"], [*headers, ("Content-Length", str(len(body) + 1))], body
        )
    else:  # chunked-bad: a chunk shorter than its data, or a size that is not hex
        malformed = True
        head = request_bytes(spec["method"], spec["path"], headers, b"x", chunks=[])
        head = head[: head.index(b"\r\n\r\n") + 4]
        size = f"{len(body) - 1:x}" if len(body) >= 2 else "zz"
        wire = head + size.encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"
    return Sent(rid, spec["method"], spec["path"], sent_body, encoding, wire, malformed)


async def _run(port: int, batches: list[list[Sent]]) -> list[list[Message]]:
    results = await asyncio.gather(
        *[
            exchange(port, b"".join(s.wire for s in batch), len(batch), wait=5.0)
            for batch in batches
        ]
    )
    return [answers for answers, _ in results]


def _check(upstream: RawUpstream, batches: list[list[Sent]], answers: list[list[Message]]) -> None:
    received, errors = upstream.snapshot()
    with upstream._lock:
        aborted = list(upstream.aborted)
    assert errors == [], errors
    by_id: dict[str, list[Message]] = {}
    for msg in received:
        rid = msg.header("X-Request-Id") or ""
        if not rid.startswith("relay-"):
            # Only the sidecar's own reads (owner lookups, readiness) come untagged.
            assert msg.method == "GET", msg.start
            assert not msg.body, msg.start
            assert msg.header("X-Forwarded-For") is None, msg.start
            continue
        by_id.setdefault(rid, []).append(msg)
        assert b"smuggled" not in msg.start
    aborted_ids = {m.header("X-Request-Id") for m in aborted}
    sent_ids = {s.rid for batch in batches for s in batch}
    assert set(by_id) <= sent_ids, set(by_id) - sent_ids
    for batch, got in zip(batches, answers, strict=True):
        assert len(got) <= len(batch)
        for i, sent in enumerate(batch):
            status = got[i].status if i < len(got) else None
            forwarded = by_id.get(sent.rid, [])
            context = (sent.rid, status, sent.wire[:300])
            assert status is None or status < 500, context
            if status == 200 and got[i].header("X-Upstream") == "1":
                assert not sent.malformed, context
                assert len(forwarded) == 1, context
                up = forwarded[0]
                assert up.method == sent.method, context
                assert up.target == sent.target, context
                assert up.body == (sent.body or b""), context
                assert up.values("Content-Encoding") == (
                    [sent.encoding] if sent.encoding else []
                ), context
                assert up.values("X-Remote-User") == ["admin"], context
                for name, _ in up.headers:
                    lower = name.lower().replace("_", "-")
                    assert lower != "expect", context  # the sidecar answers Expect itself
                    if lower.startswith("x-remote-"):
                        assert name in ("X-Remote-User", "X-Remote-Tenant", "X-Remote-Group"), (
                            context
                        )
            else:
                assert status is None or 400 <= status < 500, context
                assert forwarded == [], context
                if sent.rid in aborted_ids:
                    assert status in (None, 400, 413), context


# No shrink phase: a failing example may wait out timeouts, and shrinking it would
# take minutes; the failing example is reported as generated.
@settings(
    max_examples=300,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(specs=st.lists(st.lists(_request, min_size=1, max_size=3), min_size=1, max_size=3))
def test_every_request_is_relayed_exactly_or_refused(
    relay: tuple[RawUpstream, int],
    specs: list[list[dict[str, Any]]],
) -> None:
    upstream, port = relay
    upstream.clear()
    batches = [[_build(spec) for spec in batch] for batch in specs]
    answers = asyncio.run(_run(port, batches))
    _check(upstream, batches, answers)


def test_relay_fixture_sanity(relay: tuple[RawUpstream, int], tmp_path: Path) -> None:
    """The harness itself: a plain request is relayed and recorded."""
    upstream, port = relay
    upstream.clear()
    sent = _build(
        {
            "method": "PUT",
            "path": EVENTS + "/e1",
            "plain": b"hello",
            "coding": "none",
            "framing": "length",
            "cuts": [],
            "connection": None,
            "ctype": None,
            "expect": False,
            "remote": None,
        }
    )
    answers = asyncio.run(_run(port, [[sent]]))
    assert [a.status for a in answers[0]] == [200]
    _check(upstream, [[sent]], answers)

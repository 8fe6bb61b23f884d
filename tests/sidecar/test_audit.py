"""The audit log: JSON lines to a file or stdout, never blocking, drops counted."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from sidecar.audit import AuditLog, encode, line_for
from sidecar.config import AuditConfig
from sidecar.context import Identity, RequestContext
from sidecar.errors import StatusError
from sidecar.metrics import Metrics
from sidecar.policy.decision import Verdict
from sidecar.target import RequestTarget
from tests.rigs.waiting import eventually


def dropped(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("sidecar_audit_dropped_total") or 0.0


async def test_records_are_written_as_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(AuditConfig(path=str(path)), Metrics())
    await log.start()
    for i in range(100):
        log.emit({"requestId": f"r{i}", "reason": "line\nbreak", "decision": "allow"})
    log.emit({"requestId": "odd", "value": {1, 2}})  # not JSON-native: written as a string
    await log.stop()
    lines = path.read_text().splitlines()
    assert len(lines) == 101
    records = [json.loads(line) for line in lines]
    assert [r["requestId"] for r in records[:100]] == [f"r{i}" for i in range(100)]
    assert records[0]["reason"] == "line\nbreak"
    assert records[100]["requestId"] == "odd"


async def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_text('{"old":true}\n')
    log = AuditLog(AuditConfig(path=str(path)), Metrics())
    await log.start()
    log.emit({"new": True})
    await log.stop()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"old": True}, {"new": True}]


async def test_stdout_sink(capsys: pytest.CaptureFixture[str]) -> None:
    log = AuditLog(AuditConfig(path="-"), Metrics())
    await log.start()
    log.emit({"requestId": "x1", "status": 200})
    await log.stop()
    assert json.loads(capsys.readouterr().out.strip()) == {"requestId": "x1", "status": 200}


async def test_full_queue_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    metrics = Metrics()
    log = AuditLog(AuditConfig(path=str(tmp_path / "a.log"), queue_size=10), metrics)
    # Not started: nothing drains, so the sink is as slow as it gets.
    for i in range(25):
        log.emit({"i": i})
    assert dropped(metrics) == 15
    await log.start()
    await log.stop()
    lines = (tmp_path / "a.log").read_text().splitlines()
    assert [json.loads(x)["i"] for x in lines] == list(range(10))


async def test_slow_sink_never_slows_emit(tmp_path: Path) -> None:
    """A sink that blocks for a long time (a stuck pipe): emit keeps returning at once,
    the overflow is dropped and counted, and the event loop keeps running."""
    metrics = Metrics()
    log = AuditLog(AuditConfig(path=str(tmp_path / "a.log"), queue_size=50), metrics)
    await log.start()
    gate = asyncio.Event()
    release = threading.Event()
    real_write = log._write_batch
    entered = threading.Event()

    def stuck_write(batch: list[dict[str, Any] | str]) -> None:
        entered.set()
        release.wait(30)
        real_write(batch)

    log._write_batch = stuck_write  # type: ignore[method-assign]
    log.emit({"first": True})
    # The drain has taken the first record and is now stuck in the writer thread.
    assert await asyncio.to_thread(entered.wait, 10)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not gate.is_set():
            ticks += 1
            await asyncio.sleep(0)  # the behaviour under test: one event loop turn each

    task = asyncio.create_task(ticker())
    for i in range(500):
        log.emit({"i": i})
    await eventually(lambda: ticks > 0, what="the event loop turns while the writer is stuck")
    gate.set()
    await task
    assert ticks > 0
    assert dropped(metrics) == 450
    release.set()
    await log.stop()
    lines = (tmp_path / "a.log").read_text().splitlines()
    assert len(lines) == 51


async def test_unwritable_path_fails_start(tmp_path: Path) -> None:
    log = AuditLog(AuditConfig(path=str(tmp_path / "no" / "such" / "dir.log")), Metrics())
    with pytest.raises(FileNotFoundError):
        await log.start()


# Text that JSON and log shippers find awkward: quotes, backslashes, control and line
# separator characters, non-ASCII, lone surrogates.
_AWKWARD = st.text(
    alphabet=st.one_of(
        st.sampled_from(['"', "\\", "\n", "\r", "\u2028", "\u2029", "\x85", "\x00", "é", "\ud800"]),
        st.characters(),
    ),
    max_size=12,
)


@given(
    user=_AWKWARD,
    groups=st.lists(_AWKWARD, max_size=3),
    name=_AWKWARD,
    namespace=st.one_of(st.none(), _AWKWARD),
    reason=_AWKWARD,
    raw_path=_AWKWARD,
    notes=st.dictionaries(_AWKWARD, st.one_of(_AWKWARD, st.integers(), st.none()), max_size=3),
    status=st.integers(100, 599),
    with_identity=st.booleans(),
    with_target=st.booleans(),
    with_decision=st.booleans(),
)
def test_a_request_line_is_the_record_encoded(
    user: str,
    groups: list[str],
    name: str,
    namespace: str | None,
    reason: str,
    raw_path: str,
    notes: dict[str, Any],
    status: int,
    with_identity: bool,
    with_target: bool,
    with_decision: bool,
) -> None:
    """`line_for` writes, text for text, what `encode` gives for the documented record
    (DESIGN §9) followed by the stages' notes: one line, ASCII only."""
    request = make_mocked_request("GET", "/x")
    ctx = RequestContext(
        request=request,
        request_id="req-1",
        policy=cast(Any, SimpleNamespace(revision="rev-0")),
        max_body_bytes=10,
    )
    ctx.audit.update(notes)
    identity = Identity(user, "acme", tuple(groups), "token") if with_identity else None
    target = (
        RequestTarget(
            path="/p",
            verb="get",
            resource_request=True,
            api_group="compute",
            tenant="acme",
            namespace=namespace,
            resource="servers",
            subresource="tags",
            name=name,
        )
        if with_target
        else None
    )
    decision = Verdict("allow", reason, "rev-1") if with_decision else None
    ctx.identity, ctx.target, ctx.decision = identity, target, decision
    ctx.error = None if with_decision else StatusError(403, reason)
    line = line_for(_with_raw_path(ctx, raw_path), status)
    record = json.loads(line)
    expected: dict[str, Any] = {
        "time": record["time"],
        "requestId": "req-1",
        "user": user if identity else None,
        "tenant": "acme" if identity else None,
        "groups": groups if identity else [],
        "method": "GET",
        "path": raw_path,
        "verb": "get",
        "apiGroup": "compute" if target else None,
        "resource": "servers/tags" if target else None,
        "targetTenant": "acme" if target else None,
        "namespace": namespace if target else None,
        "name": name if target else None,
        "decision": "allow" if decision else "none",
        "reason": reason,
        "revision": "rev-1" if decision else "rev-0",
        "status": status,
        "latencyMs": record["latencyMs"],
        "client": request.remote,
        **notes,
    }
    assert line == encode(expected)
    assert line.isascii()
    assert line.count("\n") == 1


def _with_raw_path(ctx: RequestContext, raw_path: str) -> RequestContext:
    """The context with a request whose raw path is `raw_path` (any text)."""
    ctx.request = cast(
        Any, SimpleNamespace(method="GET", raw_path=raw_path, remote=ctx.request.remote)
    )
    return ctx

"""The audit log: JSON lines to a file or stdout, never blocking, drops counted."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config.settings import AuditConfig
from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.core.target import RequestTarget
from sidecar.pipeline.audit import line_for
from sidecar.pipeline.context import RequestContext
from sidecar.policy.decision import Verdict
from sidecar.services.audit import (
    FAILURE_LOG_SECONDS,
    MAX_RECORD_BYTES,
    AnonymousRefusals,
    AuditLog,
    FileSink,
    SinkError,
    cap,
    encode,
)
from sidecar.services.metrics import Metrics
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


def _request(
    user: str,
    groups: list[str],
    name: str,
    namespace: str | None,
    reason: str,
    raw_path: str,
    notes: dict[str, Any],
    with_identity: bool,
    with_target: bool,
    with_decision: bool,
) -> tuple[RequestContext, dict[str, Any]]:
    """A finished request's context and the record DESIGN §9 documents for it (its
    `time` and `latencyMs` are None: the caller fills them from the line)."""
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
    expected: dict[str, Any] = {
        "time": None,
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
        "status": None,
        "latencyMs": None,
        "client": request.remote,
        **notes,
    }
    return _with_raw_path(ctx, raw_path), expected


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
    ctx, expected = _request(
        user, groups, name, namespace, reason, raw_path, notes,
        with_identity, with_target, with_decision,
    )  # fmt: skip
    line = line_for(ctx, status)
    record = json.loads(line)
    expected.update(time=record["time"], latencyMs=record["latencyMs"], status=status)
    assert line == encode(expected)
    assert line.isascii()
    assert line.count("\n") == 1


# Long values: a short awkward text many times over (a 30 KB target, a JWT's thousand
# groups, a long reason), so that some records are far over 4 KiB and some just over.
_LONG = st.builds(lambda text, times: text * times, _AWKWARD, st.integers(0, 2500))


@given(
    user=_LONG,
    groups=st.builds(
        lambda some, times: some * times, st.lists(_AWKWARD, max_size=3), st.integers(0, 400)
    ),
    name=_AWKWARD,
    namespace=st.one_of(st.none(), _AWKWARD),
    reason=_LONG,
    raw_path=_LONG,
    notes=st.dictionaries(
        st.sampled_from(["ratelimit", "authenticator", "watch", "quota"]),
        st.one_of(_LONG, st.integers(), st.none(), st.lists(st.integers(), max_size=400)),
        max_size=3,
    ),
    with_identity=st.booleans(),
    with_target=st.booleans(),
    with_decision=st.booleans(),
)
def test_a_long_record_is_cut_to_4_kib_and_marked(
    user: str,
    groups: list[str],
    name: str,
    namespace: str | None,
    reason: str,
    raw_path: str,
    notes: dict[str, Any],
    with_identity: bool,
    with_target: bool,
    with_decision: bool,
) -> None:
    """DESIGN §9: a record is at most 4 KiB, still exactly one line of valid JSON: a
    record that fits is the record encoded; a longer one is the same record with values
    cut to prefixes (lists to their first items), every key kept, `"truncated": true`,
    and no value shorter than a fair share of the 4 KiB cut at all."""
    ctx, expected = _request(
        user, groups, name, namespace, reason, raw_path, notes,
        with_identity, with_target, with_decision,
    )  # fmt: skip
    line = line_for(ctx, 403)
    assert len(line.encode()) <= MAX_RECORD_BYTES
    assert line.isascii()
    assert line.count("\n") == 1
    assert line.endswith("\n")
    record = json.loads(line)
    expected.update(time=record["time"], latencyMs=record["latencyMs"], status=403)
    if len(encode(expected)) <= MAX_RECORD_BYTES:
        assert line == encode(expected)
        return
    assert record.pop("truncated") is True
    assert list(record) == list(expected)
    # Room the keys and the smallest values leave, shared by every key.
    fair_share = (MAX_RECORD_BYTES - 1000) // (len(expected) + 1)
    for key, full in expected.items():
        cut = record[key]
        if len(encode(full)) <= fair_share:
            assert cut == full, key
        elif cut == full:
            continue
        elif isinstance(full, str):
            assert full.startswith(cut), key
        elif isinstance(full, list) and all(isinstance(g, str) for g in full):
            assert cut == full[: len(cut)], key
        elif isinstance(full, list):  # kept as its JSON text, cut
            assert json.dumps(full, separators=(",", ":")).startswith(cut), key
        else:
            assert cut == full, key


def test_a_30_kb_target_is_cut_and_the_rest_of_the_record_kept() -> None:
    ctx, expected = _request(
        "alice", ["devs"], "web-1", "dev", "allowed", "/api/v1/x?q=" + "A" * 30000, {},
        True, True, True,
    )  # fmt: skip
    line = line_for(ctx, 200)
    assert len(line) <= MAX_RECORD_BYTES
    record = json.loads(line)
    assert record["truncated"] is True
    assert record["path"].startswith("/api/v1/x?q=AAAA")
    assert 3000 < len(record["path"]) < 4096
    for key in ("user", "groups", "name", "namespace", "reason", "requestId", "client"):
        assert record[key] == expected[key]


def _with_raw_path(ctx: RequestContext, raw_path: str) -> RequestContext:
    """The context with a request whose raw path is `raw_path` (any text)."""
    ctx.request = cast(
        Any, SimpleNamespace(method="GET", raw_path=raw_path, remote=ctx.request.remote)
    )
    return ctx


# -- anonymous refusals -------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def add(refusals: AnonymousRefusals, ctx: RequestContext, status: int) -> None:
    """What the audit stage does with an anonymous refusal."""
    refusals.add(ctx.request.remote or "unknown", lambda: line_for(ctx, status))


def _refused(address: str, request_id: str, raw_path: str = "/api/v1/pods") -> RequestContext:
    ctx, _ = _request("", [], "", None, "too many", raw_path, {}, False, False, False)
    ctx.request_id = request_id
    ctx.audit["ratelimit"] = "limited:anonymous"
    ctx.request = cast(Any, SimpleNamespace(method="GET", raw_path=raw_path, remote=address))
    return ctx


def _records(lines: list[str]) -> list[dict[str, Any]]:
    for line in lines:
        assert line.endswith("}\n")
        assert line.count("\n") == 1
        assert len(line) <= MAX_RECORD_BYTES
    return [json.loads(line) for line in lines]


async def test_refusals_of_an_address_are_one_record_per_window_with_their_count() -> None:
    lines: list[str] = []
    clock = _Clock()
    refusals = AnonymousRefusals(lines.append, window=1.0, clock=clock)
    flood = _refused("10.0.0.1", "a0")
    for i in range(1000):
        flood.request_id = f"a{i}"  # the record is the first refusal's
        add(refusals, flood, 429)
    add(refusals, _refused("10.0.0.2", "b0"), 429)
    assert lines == []  # nothing written while the windows are open
    clock.now += 0.5
    add(refusals, _refused("10.0.0.1", "a-late"), 429)
    clock.now += 0.6
    refusals.flush()  # the first windows have passed
    first = _records(lines)
    assert [(r["requestId"], r["client"], r["count"]) for r in first] == [
        ("a0", "10.0.0.1", 1001),
        ("b0", "10.0.0.2", 1),
    ]
    assert first[0]["status"] == 429
    # A refusal after the window opens the next one; the counts add up to the refusals.
    add(refusals, _refused("10.0.0.1", "a-next"), 429)
    add(refusals, _refused("10.0.0.1", "a-next-2"), 429)
    refusals.flush()
    assert len(lines) == 2  # that window is still open
    refusals.flush(everything=True)
    records = _records(lines)
    assert [(r["requestId"], r["count"]) for r in records[2:]] == [("a-next", 2)]
    assert sum(r["count"] for r in records) == 1004


async def test_the_open_windows_are_bounded_and_an_evicted_one_keeps_its_count() -> None:
    lines: list[str] = []
    refusals = AnonymousRefusals(lines.append, window=1.0, max_addresses=3, clock=_Clock())
    for i in range(10):
        for j in range(i + 1):
            add(refusals, _refused(f"10.0.1.{i}", f"r{i}-{j}"), 429)
        assert len(refusals._open) <= 3
    refusals.flush(everything=True)
    records = _records(lines)
    assert sorted(r["client"] for r in records) == sorted(f"10.0.1.{i}" for i in range(10))
    assert {r["client"]: r["count"] for r in records} == {f"10.0.1.{i}": i + 1 for i in range(10)}


async def test_an_aggregated_record_of_a_30_kb_target_with_its_count_fits_4_kib() -> None:
    lines: list[str] = []
    refusals = AnonymousRefusals(lines.append, clock=_Clock())
    flood = _refused("10.0.0.9", "x0", "/api/v1/pods?q=" + "\u2028" * 30000)
    for _ in range(12345):
        add(refusals, flood, 429)
    refusals.flush(everything=True)
    (record,) = _records(lines)
    assert record["count"] == 12345
    assert record["truncated"] is True
    assert set("".join(record["path"][len("/api/v1/pods?q=") :])) <= {"\u2028"}


async def test_the_window_closes_by_itself() -> None:
    lines: list[str] = []
    refusals = AnonymousRefusals(lines.append, window=0.05)
    for i in range(5):
        add(refusals, _refused("10.0.0.3", f"t{i}"), 429)
    await eventually(lambda: lines, what="the window's record written by its timer")
    assert [(r["requestId"], r["count"]) for r in _records(lines)] == [("t0", 5)]
    assert refusals._timer is None  # no timer left running while nothing is open


def test_cap_keeps_a_short_line_and_cuts_a_long_one() -> None:
    short = encode({"time": "t", "path": "/x"})
    assert cap(short) == short
    long = encode({"time": "t", "path": "/" + "x" * 10000, "groups": ["g"] * 5000})
    cut = json.loads(cap(long, 1000))
    assert len(cap(long, 1000)) <= 1000
    assert cut["time"] == "t"
    assert cut["truncated"] is True
    assert cut["path"].startswith("/xxx")
    assert cut["groups"][:1] == ["g"]


# -- a sink that cannot be written ---------------------------------------------------------


def test_a_write_cut_short_keeps_the_whole_records_and_takes_the_cut_one_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fills in the middle of a batch: the records written whole stay, the
    one cut short is removed, nothing is half written (DESIGN §9)."""
    path = tmp_path / "audit.log"
    path.write_bytes(b'{"old":1}\n')
    sink = FileSink.open(str(path))
    real_write = os.write
    room = [25]  # bytes the "disk" still takes

    def full_disk(fd: int, data: Any) -> int:
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data[: room[0]]))
        room[0] -= n
        return n

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(SinkError) as caught:
        sink.write(b'{"a":1}\n{"b":2}\n{"c":3333333}\n{"d":4}\n')
    assert caught.value.kept == 2
    assert caught.value.reason == "No space left on device"
    assert path.read_bytes() == b'{"old":1}\n{"a":1}\n{"b":2}\n'
    with pytest.raises(SinkError) as caught:
        sink.write(b'{"e":5}\n')
    assert caught.value.kept == 0
    monkeypatch.setattr(os, "write", real_write)
    sink.write(b'{"f":6}\n')
    sink.close()
    assert path.read_bytes() == b'{"old":1}\n{"a":1}\n{"b":2}\n{"f":6}\n'


async def test_a_failing_sink_is_degraded_and_logged_once_per_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    now = [1000.0]
    log = AuditLog(AuditConfig(path=str(tmp_path / "a.log")), metrics, clock=lambda: now[0])
    await log.start()
    assert await log.ready() == (True, "writing")
    good = log._sink
    log._sink = FileSink.open("/dev/full")  # the fault: every write fails
    caplog.set_level(logging.WARNING, logger="sidecar.audit")

    async def batch(n: int) -> None:
        """`n` records, once the writer has dealt with them (written or dropped)."""
        done = log.written + log.dropped + n
        for i in range(n):
            log.emit({"i": i})
        await eventually(lambda: log.written + log.dropped == done, what="the batch dealt with")

    for _ in range(3):
        await batch(4)
    ok, detail = await log.ready()
    assert not ok
    assert detail == "cannot write the audit log (No space left on device); records are dropped"
    failures = [r for r in caplog.records if "cannot write the audit log" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in caplog.records]
    assert not any(r.exc_info for r in caplog.records)
    now[0] += FAILURE_LOG_SECONDS
    await batch(2)
    failures = [r for r in caplog.records if "cannot write the audit log" in r.getMessage()]
    assert len(failures) == 2
    assert "10 records dropped in the last 30 s" in failures[1].getMessage()
    assert dropped(metrics) == 14
    assert isinstance(log._sink, FileSink)
    log._sink.close()
    log._sink = good  # the disk has room again
    await batch(1)
    assert await log.ready() == (True, "writing")
    assert any("writing the audit log again" in r.getMessage() for r in caplog.records)
    await log.stop()
    assert [json.loads(x) for x in (tmp_path / "a.log").read_text().splitlines()] == [{"i": 0}]

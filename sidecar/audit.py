"""Audit log: one JSON line per request, written off the request path, and the audit
stage that records each request.

`emit(record)` only appends the record (the request's line, made by `line_for`) to a
bounded list (`audit.queueSize` records waiting) and returns; when the list is full
the record is dropped and counted in `sidecar_audit_dropped_total`, so a slow sink can
never slow requests down. A drain task takes the waiting records as one batch every
`BATCH_SECONDS`, and a dedicated writer thread writes it (encoding any record that is
not a line yet) to stdout
(`audit.path: "-"`) or appends it to a file. (A plain list and an event, not an
`asyncio.Queue`: a queue costs a few microseconds per record in futures and
bookkeeping, on every request.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from aiohttp import web

from sidecar.config import AuditConfig
from sidecar.context import CLIENT_CLOSED, RequestContext
from sidecar.metrics import Metrics
from sidecar.pipeline import Handler

log = logging.getLogger("sidecar.audit")

MAX_BATCH = 4096
# Records are collected for this long before one hand-off to the writer thread: a
# hand-off per record costs more CPU (and GIL switches) than the request itself.
BATCH_SECONDS = 0.05
STOP_FLUSH_SECONDS = 5.0


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=str)


def encode(record: dict[str, Any]) -> str:
    """One record as exactly one JSON line, whatever a name holds (DESIGN §9).

    ASCII only: `ensure_ascii=False` would leave U+2028, U+2029 and U+0085 raw, and
    log shippers (and `str.splitlines`) break lines there, splitting one record in
    two; a lone surrogate would fail the whole batch's write. Escaped, every byte of
    the line is printable ASCII and the only line break is the final newline."""
    return _ENCODER.encode(record) + "\n"


class AuditLog:
    def __init__(self, config: AuditConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._capacity = max(1, config.queue_size)
        self._pending: list[dict[str, Any] | str] = []
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._stream: IO[str] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.written = 0
        self.dropped = 0

    async def start(self) -> None:
        if self._task is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit")
        if self.config.path == "-":
            self._stream = sys.stdout
        else:
            # Opened once at start-up: a bad path fails the start, loudly.
            loop = asyncio.get_running_loop()
            try:
                self._stream = await loop.run_in_executor(self._executor, self._open)
            except OSError:
                self._executor.shutdown(wait=False)
                self._executor = None
                raise
        self._stopping = False
        self._task = asyncio.create_task(self._drain(), name="audit-drain")

    async def stop(self) -> None:
        """Flush what is queued (bounded wait), then close the file."""
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True
            self._wakeup.set()
            try:
                await asyncio.wait_for(task, STOP_FLUSH_SECONDS)
            except TimeoutError:
                log.warning("audit: %d records not flushed at shutdown", len(self._pending))
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._stream is not None and self._stream is not sys.stdout:
            self._stream.close()
        self._stream = None

    def emit(self, record: dict[str, Any] | str) -> None:
        """Queue one record (a dict, or a line `line_for` made); never blocks, never
        raises."""
        pending = self._pending
        if len(pending) >= self._capacity:
            self.dropped += 1
            self.metrics.audit_dropped.inc()
            return
        pending.append(record)
        if len(pending) == 1:
            self._wakeup.set()

    async def _drain(self) -> None:
        """Until `stop`: wait for a record, let more collect for BATCH_SECONDS, write
        them all in one hand-off to the writer thread."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            if not self._stopping:
                await asyncio.sleep(BATCH_SECONDS)
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            for start in range(0, len(batch), MAX_BATCH):
                part = batch[start : start + MAX_BATCH]
                try:
                    await loop.run_in_executor(self._executor, self._write_batch, part)
                    self.written += len(part)
                except Exception:  # a broken sink must not kill the drain task
                    log.exception("audit: cannot write %d records", len(part))
                    self.dropped += len(part)
                    self.metrics.audit_dropped.inc(len(part))
            if self._stopping and not self._pending:
                return

    def _open(self) -> IO[str]:
        return open(self.config.path, "a", encoding="utf-8")

    def _write_batch(self, batch: list[dict[str, Any] | str]) -> None:
        """In the writer thread: encode (what is not a line yet) and write one batch."""
        stream = self._stream
        if stream is None:
            return
        stream.write("".join(r if isinstance(r, str) else _safe_encode(r) for r in batch))
        stream.flush()


def _safe_encode(record: dict[str, Any]) -> str:
    try:
        return encode(record)
    except (TypeError, ValueError) as exc:
        return encode({"auditError": f"record not serializable: {exc}"})


class AuditStage:
    """One audit record per request, with its final status (499 when the client went
    away), whoever answered it."""

    name = "audit"

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        try:
            response = await call_next(ctx)
        except asyncio.CancelledError:
            self.audit.emit(line_for(ctx, CLIENT_CLOSED))
            raise
        self.audit.emit(line_for(ctx, response.status))
        return response


_clock_text: tuple[int, str] = (0, "")


def _now_text() -> str:
    """The current UTC second as text, formatted once per second (not per request)."""
    global _clock_text
    second = int(time.time())
    if second != _clock_text[0]:
        _clock_text = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
    return _clock_text[1]


# JSON string literals, ASCII-escaped (C): the same text `encode` gives a string.
_quote = json.encoder.encode_basestring_ascii


def _text(value: str | None) -> str:
    return "null" if value is None else _quote(value)


def line_for(ctx: RequestContext, status: int) -> str:
    """The audit line of a finished request (DESIGN §9): exactly what `encode` gives
    for the record `{"time", "requestId", "user", "tenant", "groups", "method", "path",
    "verb", "apiGroup", "resource", "targetTenant", "namespace", "name", "decision",
    "reason", "revision", "status", "latencyMs", "client"}` followed by the stages'
    notes (`ctx.audit`), written out field by field: about a third of the cost of
    building that dict and encoding it, on every request."""
    elapsed = time.perf_counter() - ctx.started
    target, identity, decision, error = ctx.target, ctx.identity, ctx.decision, ctx.error
    request = ctx.request
    q = _quote
    if identity is not None:
        who = (
            f'"user":{q(identity.user)},"tenant":{q(identity.tenant)},'
            f'"groups":[{",".join(map(q, identity.groups))}]'
        )
    else:
        who = '"user":null,"tenant":null,"groups":[]'
    if target is not None:
        what = (
            f'"verb":{q(target.verb)},"apiGroup":{_text(target.api_group)},'
            f'"resource":{_text(target.full_resource)},"targetTenant":{_text(target.tenant)},'
            f'"namespace":{_text(target.namespace)},"name":{_text(target.name)}'
        )
    else:
        what = (
            f'"verb":{q(request.method.lower())},"apiGroup":null,"resource":null,'
            '"targetTenant":null,"namespace":null,"name":null'
        )
    if decision is not None:
        how = (
            f'"decision":{q(decision.outcome)},"reason":{_text(decision.reason)},'
            f'"revision":{_text(decision.revision)}'
        )
    else:
        reason = _text(error.message) if error is not None else "null"
        how = f'"decision":"none","reason":{reason},"revision":{_text(ctx.policy.revision)}'
    notes = ""
    if ctx.audit:
        try:
            notes = "".join(
                f",{q(k)}:{q(v) if type(v) is str else _ENCODER.encode(v)}"
                for k, v in ctx.audit.items()
            )
        except (TypeError, ValueError) as exc:
            notes = f',"auditError":{q(f"notes not serializable: {exc}")}'
    return (
        f'{{"time":"{_now_text()}","requestId":{q(ctx.request_id)},{who},'
        f'"method":{q(request.method)},"path":{q(request.raw_path)},{what},{how},'
        f'"status":{status},"latencyMs":{round(elapsed * 1000, 3)!r},'
        f'"client":{_text(request.remote)}{notes}}}\n'
    )

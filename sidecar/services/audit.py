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

A sink that cannot be written (a full disk, a read-only file, a closed pipe) drops the
records and says so, never a traceback per record (DESIGN §9): `ready()` (the `audit`
check of `/readyz`) is failed with the reason until a write succeeds again, and one
log line per `FAILURE_LOG_SECONDS` says how many records were dropped. Records reach a
file whole or not at all: the writer appends each batch with `os.write` under an
exclusive `flock` (workers sharing the file take turns), and when the disk fills in the
middle of a batch, the records written whole are kept and the cut one is truncated
away (`FileSink`), so no line of the file is ever a part of a record.

A record is at most `MAX_RECORD_BYTES` (4 KiB, DESIGN §9): a line that would be longer
is rebuilt by `cap` with its longest texts cut (a long target, user, group list or
reason) and `"truncated": true`, still exactly one line of valid JSON. Refusals of
unauthenticated clients by the anonymous rate limit are recorded by `AnonymousRefusals`
at most once per client address per `REFUSAL_WINDOW_SECONDS`: the first refusal's
record with `"count"`, the number of refusals it stands for. So no client can write
the audit log faster than its own requests are worth (a flood of 30 KB targets once
wrote 136 MB/s).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import io
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from sidecar.config.settings import AuditConfig
from sidecar.policy.decision import Verdict
from sidecar.services.metrics import Metrics

log = logging.getLogger("sidecar.audit")

MAX_BATCH = 4096
# Records are collected for this long before one hand-off to the writer thread: a
# hand-off per record costs more CPU (and GIL switches) than the request itself.
BATCH_SECONDS = 0.05
STOP_FLUSH_SECONDS = 5.0
# The largest record, its final newline included (DESIGN §9). Lines are ASCII, so a
# line's length in characters is its length in bytes.
MAX_RECORD_BYTES = 4096
# Anonymous refusals: one record per client address per window, for at most this many
# addresses with a window open (the oldest is written early to make room).
REFUSAL_WINDOW_SECONDS = 1.0
MAX_REFUSAL_ADDRESSES = 10000
# An open window keeps its record: at most this long (so 10 MB for all of them).
REFUSAL_RECORD_BYTES = 1024
# While the sink cannot be written: at most one log line per this many seconds.
FAILURE_LOG_SECONDS = 30.0


# JSON string literals, ASCII-escaped (C): the same text `encode` gives a string.
quote = json.encoder.encode_basestring_ascii

ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=str)


def encode(record: dict[str, Any]) -> str:
    """One record as exactly one JSON line, whatever a name holds (DESIGN §9).

    ASCII only: `ensure_ascii=False` would leave U+2028, U+2029 and U+0085 raw, and
    log shippers (and `str.splitlines`) break lines there, splitting one record in
    two; a lone surrogate would fail the whole batch's write. Escaped, every byte of
    the line is printable ASCII and the only line break is the final newline."""
    return ENCODER.encode(record) + "\n"


def authz_record(v: Verdict) -> dict[str, Any]:
    """A request's `authz` note (`ctx.audit["authz"]`): the decision that let it through
    or refused it, with the rule and policy revision; whether isolation refused it
    (`concealed`: a 404), and why no mode may relax a refusal (`held`). Stages add to it (`mode`,
    a review's own `review` and `reviewReason`)."""
    record: dict[str, Any] = {
        "decision": v.outcome,
        "reason": v.reason,
        "rule": v.rule_id,
        "revision": v.revision,
    }
    if v.isolated:
        record["isolation"] = "concealed" if v.status == 404 else "forbidden"
    if v.held:
        record["held"] = v.held
    return record


class SinkError(Exception):
    """A write failed: `kept` of its records were written whole, the rest not at all."""

    def __init__(self, kept: int, reason: str) -> None:
        super().__init__(reason)
        self.kept = kept
        self.reason = reason


def _reason(exc: OSError) -> str:
    """What went wrong, without the path (DESIGN §9: no file path in /readyz)."""
    return exc.strerror or (errno.errorcode.get(exc.errno or 0) or type(exc).__name__)


class FileSink:
    """Appends batches to a file descriptor, whole records or none (module docstring)."""

    def __init__(self, fd: int, owned: bool) -> None:
        self.fd = fd
        self.owned = owned
        self.regular = stat.S_ISREG(os.fstat(fd).st_mode)

    @classmethod
    def open(cls, path: str) -> FileSink:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        return cls(os.open(path, flags, 0o666), owned=True)

    def write(self, data: bytes) -> None:
        """Write `data` (whole lines); SinkError with the lines kept when it fails."""
        if self.regular:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            self._write(data)
        finally:
            if self.regular:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                n = os.write(self.fd, view[done:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except OSError as exc:
            whole = data.rfind(b"\n", 0, done) + 1
            if whole < done:
                self._take_back(done - whole)
            raise SinkError(data.count(b"\n", 0, whole), _reason(exc)) from None

    def _take_back(self, cut: int) -> None:
        """Remove the last `cut` bytes written: the part of a record that did not fit.
        Under the lock nobody appended after them, so they end the file."""
        if not self.regular:
            return  # a pipe or a device: nothing can be taken back (and nothing kept)
        try:
            end = os.lseek(self.fd, 0, os.SEEK_END)
            os.ftruncate(self.fd, max(0, end - cut))
        except OSError as exc:
            log.error("audit: cannot remove a record cut short (%s)", _reason(exc))

    def close(self) -> None:
        if self.owned:
            os.close(self.fd)


class StreamSink:
    """A text stream without a file descriptor (stdout replaced, as under a test's
    capture): written as text, all or nothing as far as it reports."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, data: bytes) -> None:
        try:
            self.stream.write(data.decode("utf-8"))
            self.stream.flush()
        except OSError as exc:
            raise SinkError(0, _reason(exc)) from None

    def close(self) -> None:
        return


Sink = FileSink | StreamSink


def _stdout_sink() -> Sink:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, io.UnsupportedOperation, ValueError):
        return StreamSink(sys.stdout)
    sys.stdout.flush()
    return FileSink(fd, owned=False)


class AuditLog:
    def __init__(
        self, config: AuditConfig, metrics: Metrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self._capacity = max(1, config.queue_size)
        self._pending: list[dict[str, Any] | str] = []
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._sink: Sink | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.written = 0
        self.dropped = 0
        self.refusals = AnonymousRefusals(self.emit)
        # While the sink cannot be written: why, and the records dropped since the
        # last log line saying so (logged at most once per FAILURE_LOG_SECONDS).
        self.failure: str | None = None
        self._failed_unlogged = 0
        self._failure_logged_at: float | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit")
        if self.config.path == "-":
            self._sink = _stdout_sink()
        else:
            # Opened once at start-up: a bad path fails the start, loudly.
            loop = asyncio.get_running_loop()
            try:
                self._sink = await loop.run_in_executor(self._executor, self._open)
            except OSError:
                self._executor.shutdown(wait=False)
                self._executor = None
                raise
        self._stopping = False
        self._task = asyncio.create_task(self._drain(), name="audit-drain")

    async def ready(self) -> tuple[bool, str]:
        """The `/readyz` check: failed while the last write failed (with the reason);
        the sidecar still serves (DESIGN §9: the audit writer is part of readiness)."""
        if self.failure is not None:
            return False, f"cannot write the audit log ({self.failure}); records are dropped"
        return True, "writing"

    async def stop(self) -> None:
        """Flush what is queued (bounded wait), then close the file."""
        self.refusals.flush(everything=True)
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
        if self._sink is not None:
            self._sink.close()
        self._sink = None

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
                except SinkError as exc:
                    self.written += exc.kept
                    self._failed(len(part) - exc.kept, exc.reason)
                except Exception:  # a broken sink must not kill the drain task
                    log.exception("audit: cannot write %d records", len(part))
                    self._failed(len(part), "the writer failed")
                else:
                    self.written += len(part)
                    self._recovered()
            if self._stopping and not self._pending:
                return

    def _failed(self, lost: int, reason: str) -> None:
        """`lost` records were not written: counted, shown in /readyz, and logged once
        per FAILURE_LOG_SECONDS however many batches fail."""
        self.dropped += lost
        self.metrics.audit_dropped.inc(lost)
        self._failed_unlogged += lost
        now = self.clock()
        first = self.failure is None
        self.failure = reason
        logged = self._failure_logged_at
        if first or logged is None or now - logged >= FAILURE_LOG_SECONDS:
            log.error(
                "audit: cannot write the audit log (%s): %d records dropped%s; /readyz "
                "shows audit degraded until a write succeeds (next report in %.0f s)",
                reason,
                self._failed_unlogged,
                "" if first else f" in the last {now - (logged or now):.0f} s",
                FAILURE_LOG_SECONDS,
            )
            self._failure_logged_at = now
            self._failed_unlogged = 0

    def _recovered(self) -> None:
        if self.failure is None:
            return
        log.warning(
            "audit: writing the audit log again (%d more records were dropped before)",
            self._failed_unlogged,
        )
        self.failure = None
        self._failed_unlogged = 0
        self._failure_logged_at = None

    def _open(self) -> Sink:
        return FileSink.open(self.config.path)

    def _write_batch(self, batch: list[dict[str, Any] | str]) -> None:
        """In the writer thread: encode (what is not a line yet) and write one batch
        (SinkError when the sink fails, with the records written whole)."""
        sink = self._sink
        if sink is None:
            return
        text = "".join(r if isinstance(r, str) else _safe_encode(r) for r in batch)
        sink.write(text.encode("utf-8", "backslashreplace"))


def _safe_encode(record: dict[str, Any]) -> str:
    try:
        return cap(encode(record))
    except (TypeError, ValueError) as exc:
        return encode({"auditError": f"record not serializable: {exc}"[:200]})


# -- the record size cap -----------------------------------------------------------------

# The keys every record starts with; `cap` drops the keys after them (the stages' notes)
# only if even their names do not fit.
_CORE_KEYS = frozenset(
    {"time", "requestId", "user", "tenant", "groups", "method", "path", "verb", "apiGroup"}
    | {"resource", "targetTenant", "namespace", "name", "decision", "reason", "revision"}
    | {"status", "latencyMs", "client", "truncated", "impersonatedBy"}
)


def cap(line: str, limit: int = MAX_RECORD_BYTES) -> str:
    """`line` (one record) when it is at most `limit` bytes, else the same record with
    its longest values cut to fit and `"truncated": true` (DESIGN §9).

    The room the keys and the short values leave is shared max-min fairly: every value
    gets at least an equal share, and one shorter than its share keeps all of it, so
    the time, status and names stay whole and a 30 KB target or a thousand groups are
    what is cut. A text is cut to a prefix, a list of texts to its first items, an
    object value by the same sharing among its own values; any other value too long
    for its share is kept as its JSON text, cut."""
    if len(line) <= limit:
        return line
    record: dict[str, Any] = json.loads(line)
    record["truncated"] = True
    body = limit - 1  # the newline
    while True:
        fitted = ENCODER.encode(_fit(record, body))
        if len(fitted) <= body:
            return fitted + "\n"
        notes = [key for key in record if key not in _CORE_KEYS]
        if not notes:  # unreachable with the record line_for makes; never a longer line
            return encode({"time": record.get("time"), "truncated": True})
        del record[notes[-1]]


def _size(value: Any) -> int:
    return len(ENCODER.encode(value))


def _smallest(value: Any) -> Any:
    """What `value` can be cut down to."""
    if isinstance(value, str):
        return ""
    if isinstance(value, list):
        return []
    if isinstance(value, dict):
        return {key: _smallest(item) for key, item in value.items()}
    return value


def _fit(value: Any, room: int) -> Any:
    """`value` cut so that its JSON takes at most `room` bytes (as near as its smallest
    form allows)."""
    if _size(value) <= room:
        return value
    if isinstance(value, str):
        return _prefix(value, room - 2)
    if isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            return _prefix(ENCODER.encode(value), room - 2)
        kept: list[str] = []
        used = 2
        for item in value:
            used += len(quote(item)) + (1 if kept else 0)
            if used > room:
                break
            kept.append(item)
        return kept
    if not isinstance(value, dict):
        return _prefix(ENCODER.encode(value), room - 2)
    smallest = {key: _smallest(item) for key, item in value.items()}
    spare = room - _size(smallest)
    extra = {key: _size(item) - _size(smallest[key]) for key, item in value.items()}
    left = sum(1 for key in extra if extra[key] > 0)
    out = dict(smallest)
    for key in sorted((k for k in extra if extra[k] > 0), key=extra.__getitem__):
        share = min(extra[key], max(spare, 0) // left)
        out[key] = _fit(value[key], _size(smallest[key]) + share)
        spare -= _size(out[key]) - _size(smallest[key])
        left -= 1
    return out


def _prefix(text: str, room: int) -> str:
    """The longest prefix of `text` whose escaped form takes at most `room` bytes."""
    # An escaped character takes at least one byte: at most `room` characters fit.
    low, high = 0, max(0, min(len(text), room))
    while low < high:
        mid = (low + high + 1) // 2
        if len(quote(text[:mid])) - 2 <= room:
            low = mid
        else:
            high = mid - 1
    return text[:low]


# -- anonymous refusals ------------------------------------------------------------------

# `,"count":N` appended to a record: room kept for it under REFUSAL_RECORD_BYTES.
_COUNT_ROOM = 32


class _Window:
    __slots__ = ("count", "line", "opened")

    def __init__(self, opened: float, line: str) -> None:
        self.opened = opened
        self.line = line
        self.count = 1


class AnonymousRefusals:
    """Refusals of unauthenticated clients by the anonymous rate limit, written at most
    once per client address per `window` seconds (DESIGN §9).

    The first refusal of an address opens its window and keeps its record (nothing is
    built for the others: an address's flood costs a counter increment per request);
    when the window has passed, the record is emitted with `"count"`, the refusals it
    stands for, so the counts of an address's records add up to its refusals. At most
    `max_addresses` windows are open, each keeping a record of at most
    `REFUSAL_RECORD_BYTES` (cut like any record), so the memory is bounded: making room
    writes the oldest window early (by opening time), never losing its count. Windows
    are closed by a timer that runs only while one is open, and all at once by
    `flush(everything=True)` at shutdown."""

    def __init__(
        self,
        emit: Callable[[str], None],
        window: float = REFUSAL_WINDOW_SECONDS,
        max_addresses: int = MAX_REFUSAL_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emit = emit
        self.window = window
        self.max_addresses = max(1, max_addresses)
        self.clock = clock
        # In opening order (a window's count changes never move it): the oldest first.
        self._open: dict[str, _Window] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, address: str, line_for: Callable[[], str]) -> None:
        """Count one refusal of a client `address`; `line_for()` builds its record (only
        for the refusal that opens a window)."""
        now = self.clock()
        open_ = self._open
        window = open_.get(address)
        if window is not None:
            if now - window.opened < self.window:
                window.count += 1
                return
            self._close(address)
        if len(open_) >= self.max_addresses:
            self._close(next(iter(open_)))
        line = line_for()
        if len(line) > REFUSAL_RECORD_BYTES - _COUNT_ROOM:
            line = cap(line, REFUSAL_RECORD_BYTES - _COUNT_ROOM)
        open_[address] = _Window(now, line)
        if self._timer is None:
            self._schedule(self.window)

    def flush(self, everything: bool = False) -> None:
        """Write the windows that have passed (all of them with `everything`)."""
        now = self.clock()
        open_ = self._open
        while open_:
            address, window = next(iter(open_.items()))
            if not everything and now - window.opened < self.window:
                break
            self._close(address)
        if everything and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close(self, address: str) -> None:
        window = self._open.pop(address)
        self.emit(f'{window.line[:-2]},"count":{window.count}}}\n')

    def _schedule(self, delay: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.flush()
        if self._open:
            oldest = next(iter(self._open.values()))
            self._schedule(max(0.0, oldest.opened + self.window - self.clock()))

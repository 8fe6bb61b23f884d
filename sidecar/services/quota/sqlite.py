"""The embedded SQLite quota ledger (the default, `ledger: sqlite:///path`).

Safe for several sidecar processes on one host sharing the file: operations run in
`BEGIN IMMEDIATE` transactions (the write lock is taken before the first read, so two
processes can never both pass the same check), the journal is WAL with
`synchronous=NORMAL` (see docs/quotas.md, "Durability"), and a busy timeout makes a
process wait for another's transaction instead of failing.

Group commit: within a process all operations run on one ledger thread. Operations
queue up while it works; it takes every operation queued at that moment (up to
`MAX_BATCH`) and runs them one after another inside ONE transaction, each in a
savepoint of its own, so that an operation that fails is rolled back alone and the
others commit. Each still sees the writes of those before it, so the batch is exactly
as if they had run one at a time; the file checks, the `flock`, `BEGIN`/`COMMIT` and
the hand-back to the event loop are paid once per batch instead of once per operation.
No operation's result is handed back before its batch has committed.

Between processes, writers also queue on an `flock` of `<db>.lock`: SQLite's own busy
handler sleeps and retries (up to 100 ms at a time), which under contention from
several processes starved some creates for seconds; the kernel hands an `flock` over
as soon as it is released.

Tables: `reservations` (one row per pending reservation, per committed one that holds
a claim — with the create's answer for a replay — and per released id, each until it
expires; a pending one may carry the object it would make and when a 404 may release
it, `settle`, once its outcome is unknown), `inprog` (the sum of the pending
reservations' charges per tenant, scope and resource, kept in step with the rows by
every operation that adds, changes or drops a pending row; reconcile recomputes it
from the rows),
`used`, `objects`, `tombstones`, `limits` (see ledger.py) and `heartbeat` (the one row
the readiness check writes).

Faults (DESIGN §7, §9): before every transaction the file at the path is checked. If
it was deleted, the ledger fails closed (LedgerError "ledger file missing"; it does
not recreate an empty file, which would silently forget every tenant's usage) until a
file appears at the path again, which is then opened (an operator restored it). A
file replaced by another one is reopened. A file that cannot be written (`os.access`
sees the immutable flag and, for non-root users, the mode) is "ledger file is
read-only". The short reason is what `/readyz` and 503 bodies show; the path and
SQLite's own message go to the log only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote

from sidecar.services.quota.ledger import (
    TENANT_SCOPE,
    TOMBSTONE_SECONDS,
    Answer,
    Claim,
    ClaimConflict,
    ClaimReplay,
    Clock,
    Ledger,
    LedgerError,
    ObjectRef,
    QuotaExceeded,
    ReconcileResult,
    Reservation,
    Unsettled,
    Usage,
    charge_delta,
    decode_mark,
    encode_mark,
)
from sidecar.services.quota.meters import Charge

T = TypeVar("T")
log = logging.getLogger("sidecar.quota.sqlite")

# At most this many operations share one transaction (bounds how long one batch holds
# the write lock that other processes wait for).
MAX_BATCH = 128

_SCHEMA = """
CREATE TABLE IF NOT EXISTS used (
  tenant TEXT NOT NULL, scope TEXT NOT NULL, resource TEXT NOT NULL, amount INTEGER NOT NULL,
  PRIMARY KEY (tenant, scope, resource));
CREATE TABLE IF NOT EXISTS inprog (
  tenant TEXT NOT NULL, scope TEXT NOT NULL, resource TEXT NOT NULL, amount INTEGER NOT NULL,
  PRIMARY KEY (tenant, scope, resource));
CREATE TABLE IF NOT EXISTS reservations (
  id TEXT NOT NULL, tenant TEXT NOT NULL, namespace TEXT NOT NULL, charge TEXT NOT NULL,
  state TEXT NOT NULL, expires REAL NOT NULL, claim TEXT NOT NULL DEFAULT '',
  fp TEXT NOT NULL DEFAULT '', answer TEXT NOT NULL DEFAULT '',
  settle TEXT NOT NULL DEFAULT '', PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS reservations_expiry ON reservations (tenant, expires);
CREATE TABLE IF NOT EXISTS objects (
  tenant TEXT NOT NULL, namespace TEXT NOT NULL, resource TEXT NOT NULL, name TEXT NOT NULL,
  charge TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (tenant, namespace, resource, name));
CREATE TABLE IF NOT EXISTS tombstones (
  tenant TEXT NOT NULL, namespace TEXT NOT NULL, resource TEXT NOT NULL, name TEXT NOT NULL,
  at REAL NOT NULL, PRIMARY KEY (tenant, namespace, resource, name));
CREATE TABLE IF NOT EXISTS limits (
  tenant TEXT NOT NULL, scope TEXT NOT NULL, resource TEXT NOT NULL, hard INTEGER NOT NULL,
  PRIMARY KEY (tenant, scope, resource));
CREATE TABLE IF NOT EXISTS heartbeat (id INTEGER PRIMARY KEY, at REAL NOT NULL);
"""
# Files made by earlier versions get the columns they lack (and then the index).
_MIGRATIONS = {
    "claim": "ALTER TABLE reservations ADD COLUMN claim TEXT NOT NULL DEFAULT ''",
    "fp": "ALTER TABLE reservations ADD COLUMN fp TEXT NOT NULL DEFAULT ''",
    "answer": "ALTER TABLE reservations ADD COLUMN answer TEXT NOT NULL DEFAULT ''",
    "settle": "ALTER TABLE reservations ADD COLUMN settle TEXT NOT NULL DEFAULT ''",
}
# Only reservations that hold a claim are indexed by it (most hold none: every index
# entry is a write on each reserve and each commit).
_CLAIM_INDEX = (
    "CREATE INDEX IF NOT EXISTS reservations_claimed ON reservations (tenant, claim) "
    "WHERE claim != ''"
)
# `PRAGMA user_version` of a file whose `inprog` counters are kept in step with its
# pending reservations and whose claim index is partial. A file from an earlier version
# is brought there once, on open (_upgrade).
_SCHEMA_VERSION = 2

_BUMP = (
    "INSERT INTO {table} (tenant, scope, resource, amount) VALUES (?,?,?,MAX(?,0)) "
    "ON CONFLICT (tenant, scope, resource) DO UPDATE SET amount = MAX(amount + ?, 0)"
)
_BUMP_USED = _BUMP.format(table="used")
_BUMP_INPROG = _BUMP.format(table="inprog")
# Everything a quota check reads, in one statement: API limits, used, in progress, for
# the tenant scope and (when given) one namespace.
_CHECK_STATE = (
    "SELECT 0, scope, resource, hard FROM limits WHERE tenant=?1 AND scope IN ('', ?2) "
    "UNION ALL SELECT 1, scope, resource, amount FROM used WHERE tenant=?1 AND scope IN ('', ?2) "
    "UNION ALL SELECT 2, scope, resource, amount FROM inprog WHERE tenant=?1 AND scope IN ('', ?2)"
)


@dataclasses.dataclass(slots=True)
class _Op:
    """One queued operation: `fn` runs on the ledger thread inside a transaction, its
    outcome goes to `future` (on `loop`) once the transaction has committed."""

    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    ok: bool = False
    value: Any = None


class SqliteLedger(Ledger):
    def __init__(
        self,
        path: str,
        ttl_seconds: float,
        clock: Clock | None = None,
        busy_timeout_ms: int = 10000,
    ) -> None:
        super().__init__(ttl_seconds, clock)
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        # (st_dev, st_ino) of the file this process opened; None until the first open.
        self._file_id: tuple[int, int] | None = None
        # Operations waiting for the ledger thread (None: close), which starts on first use.
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        # Batches attempted and the operations they carried (for tests and benchmarks).
        self.batches = 0
        self.operations = 0

    # -- plumbing -------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self.path == ":memory:":
            if self._conn is None:
                self._conn = self._open(create=True)
            return self._conn
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            if self._file_id is not None:
                self._drop()  # never write on into an unlinked inode
                raise LedgerError(
                    "ledger file missing", f"sqlite ledger {self.path}: the file was deleted"
                ) from None
            st = None  # the first open creates it
        except OSError as exc:
            raise LedgerError(
                "ledger file not accessible", f"sqlite ledger {self.path}: {exc}"
            ) from None
        if st is not None:
            if self._file_id is not None and (st.st_dev, st.st_ino) != self._file_id:
                log.warning("sqlite ledger %s was replaced by another file; reopening", self.path)
                self._drop()
            if not os.access(self.path, os.W_OK):
                raise LedgerError(
                    "ledger file is read-only",
                    f"sqlite ledger {self.path}: the file is not writable",
                )
        if self._conn is None:
            self._conn = self._open(create=self._file_id is None)
            st = os.stat(self.path)
            self._file_id = (st.st_dev, st.st_ino)
        return self._conn

    def _open(self, create: bool) -> sqlite3.Connection:
        if self.path == ":memory:":
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        else:
            if create:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # mode=rw after the first open: a deleted ledger is never silently recreated.
            uri = f"file:{quote(os.path.abspath(self.path))}?mode={'rwc' if create else 'rw'}"
            conn = sqlite3.connect(
                uri,
                uri=True,
                timeout=self.busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(reservations)")}
            for column, statement in _MIGRATIONS.items():
                if column not in columns:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process won
                        conn.execute(statement)
            conn.execute(_CLAIM_INDEX)
            if conn.execute("PRAGMA user_version").fetchone()[0] < _SCHEMA_VERSION:
                _upgrade(conn)
        except BaseException:
            conn.close()
            raise
        if self.path != ":memory:":
            self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        return conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    @contextlib.contextmanager
    def _write_lock(self) -> Iterator[None]:
        fd = self._lock_fd
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Queue `fn` for the ledger thread; its result once its transaction committed.
        SQLite and OS errors come back as LedgerError."""
        if self._closed:
            raise LedgerError("ledger closed", f"sqlite ledger {self.path}: used after close()")
        loop = asyncio.get_running_loop()
        op = _Op(fn, loop.create_future(), loop)
        if self._thread is None:
            self._start()
        self._queue.put(op)
        return cast(T, await op.future)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._serve, name="quota-sqlite", daemon=True)
                thread.start()
                self._thread = thread

    def _serve(self) -> None:
        """The ledger thread: wait for an operation, take it with every other one queued
        by then (up to MAX_BATCH), run them in one transaction, hand the outcomes back;
        until close() queues None."""
        q = self._queue
        closing = False
        while not closing:
            first = q.get()
            batch: list[_Op] = []
            if first is None:
                closing = True
            else:
                batch.append(first)
            while not closing and len(batch) < MAX_BATCH:
                try:
                    op = q.get_nowait()
                except queue.Empty:
                    break
                if op is None:
                    closing = True
                else:
                    batch.append(op)
            if batch:
                try:
                    self._run_batch(batch)
                except BaseException as exc:  # a bug here must not strand the callers
                    log.exception("sqlite ledger: a batch failed unexpectedly")
                    for op in batch:
                        op.ok, op.value = False, exc
                self._hand_back(batch)
        self._drop()
        # Anything queued after close() began (it refuses new work, so only a race with
        # another thread's event loop) is answered rather than left waiting.
        late: list[_Op] = []
        while True:
            try:
                op = q.get_nowait()
            except queue.Empty:
                break
            if op is not None:
                op.ok, op.value = False, LedgerError("ledger closed", "sqlite ledger: closed")
                late.append(op)
        self._hand_back(late)

    def _run_batch(self, batch: list[_Op]) -> None:
        """Run the batch's operations in one transaction, each in a savepoint (a lone
        operation needs none). Sets each op's outcome; on a failure of the transaction
        itself (connect, lock, BEGIN, COMMIT, a rollback that cannot be done) every
        operation fails with it, since none of their writes were kept."""
        ops = [op for op in batch if not op.future.cancelled()]  # as a thread pool does
        for op in batch:
            op.ok, op.value = False, None
        if not ops:
            return
        try:
            conn = self._connect()
            with self._write_lock():
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if len(ops) == 1:
                        ops[0].value, ops[0].ok = ops[0].fn(conn), True
                    else:
                        for op in ops:
                            _run_in_savepoint(conn, op)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    raise
        except BaseException as exc:
            for op in ops:
                op.ok, op.value = False, self._error(exc)
            return
        finally:
            self.batches += 1
            self.operations += len(ops)
        for op in ops:
            if not op.ok:
                op.value = self._error(op.value)

    def _error(self, exc: BaseException) -> BaseException:
        """What an operation's caller gets for `exc`: SQLite and OS errors become a
        LedgerError, each caller its own instance."""
        if isinstance(exc, LedgerError):
            return LedgerError(exc.reason, exc.detail)
        if isinstance(exc, (sqlite3.Error, OSError)):
            error = LedgerError(_reason(exc), f"sqlite ledger {self.path}: {exc}")
            error.__cause__ = exc
            return error
        return exc

    @staticmethod
    def _hand_back(batch: list[_Op]) -> None:
        """Resolve the batch's futures: one call into each event loop per batch."""
        loops: dict[asyncio.AbstractEventLoop, list[_Op]] = {}
        for op in batch:
            loops.setdefault(op.loop, []).append(op)
        for loop, ops in loops.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, ops)

    async def ping(self) -> None:
        """A heartbeat written in a transaction like any operation: a full disk or a
        file that cannot be written fails it, as it would fail a reserve."""
        now = self.clock()
        await self._run(
            lambda c: c.execute("INSERT OR REPLACE INTO heartbeat (id, at) VALUES (1, ?)", (now,))
        )

    async def close(self) -> None:
        """Run what is queued, then close the file (the ledger cannot be used after)."""
        if self._closed:
            return
        self._closed = True
        thread = self._thread
        if thread is None:
            self._drop()
            return
        self._queue.put(None)
        await asyncio.get_running_loop().run_in_executor(None, thread.join)

    # -- helpers (run inside a transaction) ------------------------------------------

    def _purge(self, c: sqlite3.Connection, tenant: str, now: float) -> None:
        """Drop the tenant's expired reservations (pending ones leave `inprog`)."""
        rows = c.execute(
            "SELECT namespace, charge, state FROM reservations WHERE tenant=? AND expires<=?",
            (tenant, now),
        ).fetchall()
        if not rows:
            return
        for ns, raw, state in rows:
            if state == "pending":
                _bump(c, _BUMP_INPROG, tenant, ns, json.loads(raw), -1)
        c.execute("DELETE FROM reservations WHERE tenant=? AND expires<=?", (tenant, now))

    def _used(self, c: sqlite3.Connection, tenant: str) -> dict[str, dict[str, int]]:
        return _counters(c, "used", tenant)

    def _api_limits(self, c: sqlite3.Connection, tenant: str) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for scope, res, hard in c.execute(
            "SELECT scope, resource, hard FROM limits WHERE tenant=?", (tenant,)
        ):
            out.setdefault(scope, {})[res] = hard
        return out

    def _apply_used(
        self, c: sqlite3.Connection, tenant: str, ns: str, charge: Mapping[str, int], sign: int
    ) -> None:
        _bump(c, _BUMP_USED, tenant, ns, charge, sign)

    # -- operations ---------------------------------------------------------------------

    def _check(
        self,
        c: sqlite3.Connection,
        tenant: str,
        namespace: str,
        charge: Mapping[str, int],
        tenant_limits: Mapping[str, int],
        namespace_limits: Mapping[str, int],
    ) -> QuotaExceeded | None:
        if not charge:
            return None
        api: dict[str, dict[str, int]] = {}
        used: dict[str, dict[str, int]] = {}
        inprog: dict[str, dict[str, int]] = {}
        tables = (api, used, inprog)
        for table, scope, res, n in c.execute(_CHECK_STATE, (tenant, namespace)):
            tables[table].setdefault(scope, {})[res] = n
        checks = [("tenant", TENANT_SCOPE, {**tenant_limits, **api.get(TENANT_SCOPE, {})})]
        if namespace:
            checks.append(("namespace", namespace, {**namespace_limits, **api.get(namespace, {})}))
        for kind, scope, limits in checks:
            for res, n in charge.items():
                hard = limits.get(res)
                if hard is None:
                    continue
                u = used.get(scope, {}).get(res, 0)
                p = inprog.get(scope, {}).get(res, 0)
                if u + p + n > hard:
                    return QuotaExceeded(kind, tenant, namespace, res, n, u, p, hard)
        return None

    async def reserve(
        self,
        tenant: str,
        namespace: str,
        charge: Mapping[str, int],
        tenant_limits: Mapping[str, int],
        namespace_limits: Mapping[str, int],
        reservation_id: str,
        claim: Claim | None = None,
    ) -> Reservation:
        now = self.clock()
        expires = now + self.ttl
        charge = {k: int(v) for k, v in charge.items() if v > 0}

        def fn(c: sqlite3.Connection) -> Reservation | Exception:
            self._purge(c, tenant, now)
            if c.execute(
                "SELECT 1 FROM reservations WHERE tenant=? AND id=?", (tenant, reservation_id)
            ).fetchone():
                # This id reserved already, or was released before it arrived: no-op.
                return Reservation(reservation_id, tenant, namespace, dict(charge), now)
            previous = None
            if claim is not None:
                row = c.execute(
                    "SELECT id, fp, state, answer FROM reservations WHERE tenant=? AND claim=? "
                    "AND claim != ''",
                    (tenant, claim.key),
                ).fetchone()
                if row is not None:
                    if row[1] != claim.fingerprint:
                        return ClaimConflict(in_flight=False)
                    if row[2] == "pending":
                        return ClaimConflict(in_flight=True)
                    answer = Answer.decode(row[3]) if row[3] else None
                    if answer is not None:
                        return ClaimReplay(answer)
                    previous = row[0]
            refusal = self._check(c, tenant, namespace, charge, tenant_limits, namespace_limits)
            if refusal is not None:
                return refusal
            if previous is not None:  # committed: not in `inprog`
                c.execute("DELETE FROM reservations WHERE tenant=? AND id=?", (tenant, previous))
            c.execute(
                "INSERT INTO reservations (id, tenant, namespace, charge, state, expires, claim, "
                "fp) VALUES (?,?,?,?,'pending',?,?,?)",
                (
                    reservation_id,
                    tenant,
                    namespace,
                    json.dumps(charge),
                    expires,
                    claim.key if claim else "",
                    claim.fingerprint if claim else "",
                ),
            )
            _bump(c, _BUMP_INPROG, tenant, namespace, charge, 1)
            return Reservation(reservation_id, tenant, namespace, dict(charge), now)

        result = await self._run(fn)
        if isinstance(result, Exception):
            raise result
        return result

    async def reserve_change(
        self,
        reservation: Reservation,
        obj: ObjectRef,
        new_charge: Mapping[str, int],
        base_charge: Mapping[str, int],
        tenant_limits: Mapping[str, int],
        namespace_limits: Mapping[str, int],
    ) -> Reservation:
        now = self.clock()
        r = reservation

        def fn(c: sqlite3.Connection) -> Reservation | Exception:
            self._purge(c, r.tenant, now)
            row = c.execute(
                "SELECT state, namespace, charge FROM reservations WHERE tenant=? AND id=?",
                (r.tenant, r.id),
            ).fetchone()
            if row is None or row[0] != "pending":
                return LedgerError("reservation expired")
            c.execute(
                "UPDATE reservations SET charge='{}' WHERE tenant=? AND id=?", (r.tenant, r.id)
            )
            _bump(c, _BUMP_INPROG, r.tenant, row[1], json.loads(row[2]), -1)
            recorded = c.execute(
                "SELECT charge FROM objects WHERE tenant=? AND namespace=? AND resource=? "
                "AND name=?",
                (obj.tenant, obj.namespace, obj.resource, obj.name),
            ).fetchone()
            base = json.loads(recorded[0]) if recorded else dict(base_charge)
            increase = {k: d for k, d in charge_delta(new_charge, base).items() if d > 0}
            refusal = self._check(
                c, r.tenant, r.namespace, increase, tenant_limits, namespace_limits
            )
            if refusal is not None:
                return refusal
            c.execute(
                "UPDATE reservations SET charge=? WHERE tenant=? AND id=?",
                (json.dumps(increase), r.tenant, r.id),
            )
            _bump(c, _BUMP_INPROG, r.tenant, row[1], increase, 1)
            return dataclasses.replace(r, charge=increase)

        result = await self._run(fn)
        if isinstance(result, Exception):
            raise result
        return result

    async def commit_change(
        self, reservation: Reservation, obj: ObjectRef, new_charge: Mapping[str, int]
    ) -> None:
        now = self.clock()
        r = reservation
        new = {k: int(v) for k, v in new_charge.items() if v > 0}
        key = (obj.tenant, obj.namespace, obj.resource, obj.name)

        def fn(c: sqlite3.Connection) -> None:
            self._purge(c, r.tenant, now)
            _drop_reservation(c, r.tenant, r.id, pending_only=False)
            tomb = c.execute(
                "SELECT at FROM tombstones WHERE tenant=? AND namespace=? "
                "AND resource=? AND name=?",
                key,
            ).fetchone()
            if tomb is not None and tomb[0] >= r.created:
                return  # deleted while the update ran: its charge was returned already
            recorded = c.execute(
                "SELECT charge FROM objects WHERE tenant=? AND namespace=? "
                "AND resource=? AND name=?",
                key,
            ).fetchone()
            if recorded is None:
                c.execute("INSERT INTO objects VALUES (?,?,?,?,?,?)", (*key, json.dumps(new), now))
                delta = new
            else:
                c.execute(
                    "UPDATE objects SET charge=? WHERE tenant=? AND namespace=? "
                    "AND resource=? AND name=?",
                    (json.dumps(new), *key),
                )
                delta = charge_delta(new, json.loads(recorded[0]))
            self._apply_used(c, obj.tenant, obj.namespace, delta, 1)

        await self._run(fn)

    async def commit(
        self,
        reservation: Reservation,
        name: str,
        resource: str,
        charge: Mapping[str, int] | None = None,
        answer: Answer | None = None,
    ) -> bool:
        now = self.clock()
        r = reservation
        made = {k: int(v) for k, v in (r.charge if charge is None else charge).items() if v > 0}
        kept = answer.encode() if answer is not None else ""

        def fn(c: sqlite3.Connection) -> bool:
            # A pending reservation leaves `inprog`; one without a claim has no further
            # use and goes, one with a claim stays (committed, with the answer) until it
            # expires, so the claim is remembered (ledger.py).
            row = c.execute(
                "DELETE FROM reservations WHERE tenant=? AND id=? AND state='pending' "
                "AND claim='' RETURNING namespace, charge",
                (r.tenant, r.id),
            ).fetchone()
            if row is None:
                row = c.execute(
                    "UPDATE reservations SET state='committed', answer=?, settle='' "
                    "WHERE tenant=? AND id=? AND state='pending' RETURNING namespace, charge",
                    (kept, r.tenant, r.id),
                ).fetchone()
            if row is not None:
                _bump(c, _BUMP_INPROG, r.tenant, row[0], json.loads(row[1]), -1)
            # A record from before this reservation is of an earlier object of that
            # name, whose delete the ledger has not recorded (yet): this one replaces it.
            stale = c.execute(
                "DELETE FROM objects WHERE tenant=? AND namespace=? AND resource=? AND name=? "
                "AND at<? RETURNING charge",
                (r.tenant, r.namespace, resource, name, r.created),
            ).fetchone()
            if stale is not None:
                self._apply_used(c, r.tenant, r.namespace, json.loads(stale[0]), -1)
            created = c.execute(
                "INSERT OR IGNORE INTO objects (tenant, namespace, resource, name, charge, at) "
                "VALUES (?,?,?,?,?,?)",
                (r.tenant, r.namespace, resource, name, json.dumps(made), now),
            ).rowcount
            if not created:
                return False
            c.execute(
                "DELETE FROM tombstones WHERE tenant=? AND namespace=? AND resource=? AND name=?",
                (r.tenant, r.namespace, resource, name),
            )
            self._apply_used(c, r.tenant, r.namespace, made, 1)
            return True

        return await self._run(fn)

    async def release(self, reservation: Reservation) -> None:
        r = reservation
        expires = self.clock() + self.ttl

        def fn(c: sqlite3.Connection) -> None:
            _drop_reservation(c, r.tenant, r.id, pending_only=True)
            # Remembered as released (a reserve with this id that arrives late does
            # nothing); a committed one is left as it is.
            c.execute(
                "INSERT OR IGNORE INTO reservations (id, tenant, namespace, charge, state, "
                "expires) VALUES (?,?,?,'{}','released',?)",
                (r.id, r.tenant, r.namespace, expires),
            )

        await self._run(fn)

    async def mark_unsettled(
        self, reservation: Reservation, obj: ObjectRef, release_after: float | None = None
    ) -> None:
        r = reservation
        mark = encode_mark(obj, release_after)
        await self._run(
            lambda c: c.execute(
                "UPDATE reservations SET settle=? WHERE tenant=? AND id=? AND state='pending'",
                (mark, r.tenant, r.id),
            )
        )

    async def unsettled(self, tenant: str) -> list[Unsettled]:
        now = self.clock()

        def fn(c: sqlite3.Connection) -> list[Unsettled]:
            self._purge(c, tenant, now)
            rows = c.execute(
                "SELECT id, namespace, charge, expires, settle FROM reservations "
                "WHERE tenant=? AND state='pending' AND settle != ''",
                (tenant,),
            ).fetchall()
            return [
                decode_mark(
                    Reservation(rid, tenant, ns, json.loads(raw), expires - self.ttl), mark, expires
                )
                for rid, ns, raw, expires, mark in rows
            ]

        return await self._run(fn)

    async def delete(self, obj: ObjectRef, at: float | None = None) -> Charge | None:
        now = self.clock()
        when = now if at is None else at

        def fn(c: sqlite3.Connection) -> Charge | None:
            key = (obj.tenant, obj.namespace, obj.resource, obj.name)
            row = c.execute(
                "SELECT charge, at FROM objects WHERE tenant=? AND namespace=? AND resource=? "
                "AND name=?",
                key,
            ).fetchone()
            if row is not None and row[1] > when:
                return None  # made after this delete: another object of the same name
            c.execute(
                "DELETE FROM tombstones WHERE tenant=? AND at<?",
                (obj.tenant, now - TOMBSTONE_SECONDS),
            )
            c.execute(
                "INSERT INTO tombstones VALUES (?,?,?,?,?) ON CONFLICT "
                "(tenant, namespace, resource, name) DO UPDATE SET at = MAX(at, excluded.at)",
                (*key, when),
            )
            if row is None:
                return None
            charge: Charge = json.loads(row[0])
            c.execute(
                "DELETE FROM objects WHERE tenant=? AND namespace=? AND resource=? AND name=?", key
            )
            self._apply_used(c, obj.tenant, obj.namespace, charge, -1)
            return charge

        return await self._run(fn)

    async def delete_scope(
        self, tenant: str, namespace: str | None, at: float | None = None
    ) -> int:
        when = self.clock() if at is None else at
        where = "tenant=? AND at<=?" + ("" if namespace is None else " AND namespace=?")
        args: tuple[Any, ...] = (tenant, when) if namespace is None else (tenant, when, namespace)

        def fn(c: sqlite3.Connection) -> int:
            # Reservations in flight (and their `inprog`) are left to commit or expire;
            # objects recorded after the delete (made since, in a scope made again) stay.
            rows = c.execute(
                f"DELETE FROM objects WHERE {where} RETURNING namespace, resource, name", args
            ).fetchall()
            if namespace is None:
                c.execute("DELETE FROM limits WHERE tenant=?", (tenant,))
            else:
                c.execute("DELETE FROM limits WHERE tenant=? AND scope=?", (tenant, namespace))
            _recount_used(c, tenant)
            c.executemany(
                "INSERT INTO tombstones VALUES (?,?,?,?,?) ON CONFLICT "
                "(tenant, namespace, resource, name) DO UPDATE SET at = MAX(at, excluded.at)",
                [(tenant, *row, when) for row in rows],
            )
            return len(rows)

        return await self._run(fn)

    async def usage(self, tenant: str) -> Usage:
        now = self.clock()

        def fn(c: sqlite3.Connection) -> Usage:
            self._purge(c, tenant, now)
            inprog = {
                scope: nonzero
                for scope, amounts in _counters(c, "inprog", tenant).items()
                if (nonzero := {res: n for res, n in amounts.items() if n})
            }
            return Usage(self._used(c, tenant), inprog, self._api_limits(c, tenant))

        return await self._run(fn)

    async def set_limit(self, tenant: str, namespace: str, resource: str, hard: int | None) -> None:
        def fn(c: sqlite3.Connection) -> None:
            if hard is None:
                c.execute(
                    "DELETE FROM limits WHERE tenant=? AND scope=? AND resource=?",
                    (tenant, namespace, resource),
                )
            else:
                c.execute(
                    "INSERT OR REPLACE INTO limits VALUES (?,?,?,?)",
                    (tenant, namespace, resource, int(hard)),
                )

        await self._run(fn)

    async def tenants(self) -> list[str]:
        def fn(c: sqlite3.Connection) -> list[str]:
            rows = c.execute(
                "SELECT tenant FROM used UNION SELECT tenant FROM limits "
                "UNION SELECT tenant FROM reservations ORDER BY 1"
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(fn)

    async def reconcile_set(
        self,
        tenant: str,
        resources: list[str],
        objects: Mapping[ObjectRef, Charge],
        started_at: float,
    ) -> ReconcileResult:
        now = self.clock()
        listing = {
            (o.namespace, o.resource, o.name): dict(ch)
            for o, ch in objects.items()
            if o.tenant == tenant
        }
        covered = set(resources)

        def fn(c: sqlite3.Connection) -> ReconcileResult:
            self._purge(c, tenant, now)
            before = self._used(c, tenant).get(TENANT_SCOPE, {})
            added = removed = changed = 0
            seen: set[tuple[str, str, str]] = set()
            for ns, res, name, raw, at in c.execute(
                "SELECT namespace, resource, name, charge, at FROM objects WHERE tenant=?",
                (tenant,),
            ).fetchall():
                if res not in covered:
                    continue
                key = (ns, res, name)
                if key not in listing:
                    if at < started_at:
                        c.execute(
                            "DELETE FROM objects WHERE tenant=? AND namespace=? "
                            "AND resource=? AND name=?",
                            (tenant, *key),
                        )
                        removed += 1
                    continue
                seen.add(key)
                if json.loads(raw) != listing[key]:
                    c.execute(
                        "UPDATE objects SET charge=? WHERE tenant=? AND namespace=? "
                        "AND resource=? AND name=?",
                        (json.dumps(listing[key]), tenant, *key),
                    )
                    changed += 1
            for key, charge in listing.items():
                if key in seen:
                    continue
                tomb = c.execute(
                    "SELECT at FROM tombstones WHERE tenant=? AND namespace=? "
                    "AND resource=? AND name=?",
                    (tenant, *key),
                ).fetchone()
                if tomb is not None and tomb[0] >= started_at:
                    continue
                c.execute(
                    "INSERT INTO objects VALUES (?,?,?,?,?,?)",
                    (tenant, *key, json.dumps(charge), started_at),
                )
                added += 1
            c.execute("DELETE FROM tombstones WHERE tenant=? AND at<?", (tenant, started_at))
            _recount_used(c, tenant)
            # The reservations stay as they are; their counters are recounted from them
            # (they can only have drifted if a process of an older version shared the
            # file).
            _recount_in_progress(c, tenant)
            after = self._used(c, tenant).get(TENANT_SCOPE, {})
            return ReconcileResult(added, removed, changed, before, after)

        return await self._run(fn)


def _run_in_savepoint(conn: sqlite3.Connection, op: _Op) -> None:
    """Run one operation of a batch; if it raises, undo its writes only. When SQLite
    has already rolled back the whole transaction (some I/O errors do), the error is
    the batch's: re-raised."""
    conn.execute("SAVEPOINT op")
    try:
        op.value = op.fn(conn)
    except Exception as exc:
        if not conn.in_transaction:
            raise
        conn.execute("ROLLBACK TO op")
        conn.execute("RELEASE op")
        op.value = exc
        return
    conn.execute("RELEASE op")
    op.ok = True


def _resolve(ops: list[_Op]) -> None:
    """On the event loop: hand each operation's outcome to its caller."""
    for op in ops:
        if op.future.done():  # the caller was cancelled
            continue
        if op.ok:
            op.future.set_result(op.value)
        elif op.value is None:  # skipped: cancelled before it ran
            op.future.cancel()
        else:
            op.future.set_exception(op.value)


def _bump(
    c: sqlite3.Connection,
    statement: str,
    tenant: str,
    ns: str,
    charge: Mapping[str, int],
    sign: int,
) -> None:
    """Add `sign * charge` to a counter table (`used` or `inprog`), in the tenant scope
    and, when `ns`, the namespace scope; counters never go below 0."""
    if not charge:
        return
    rows = [(tenant, TENANT_SCOPE, res, sign * n, sign * n) for res, n in charge.items()]
    if ns:
        rows += [(tenant, ns, res, sign * n, sign * n) for res, n in charge.items()]
    c.executemany(statement, rows)


def _drop_reservation(c: sqlite3.Connection, tenant: str, rid: str, pending_only: bool) -> None:
    """Delete a reservation (with `pending_only`, only a pending one); a pending one
    leaves `inprog`."""
    row = c.execute(
        "DELETE FROM reservations WHERE tenant=? AND id=? "
        + ("AND state='pending' " if pending_only else "")
        + "RETURNING namespace, charge, state",
        (tenant, rid),
    ).fetchone()
    if row is not None and row[2] == "pending":
        _bump(c, _BUMP_INPROG, tenant, row[0], json.loads(row[1]), -1)


def _counters(c: sqlite3.Connection, table: str, tenant: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for scope, res, amount in c.execute(
        f"SELECT scope, resource, amount FROM {table} WHERE tenant=?", (tenant,)
    ):
        out.setdefault(scope, {})[res] = amount
    return out


def _recount_used(c: sqlite3.Connection, tenant: str) -> None:
    """Set the tenant's `used` to the sums of its recorded objects' charges."""
    c.execute("DELETE FROM used WHERE tenant=?", (tenant,))
    for ns, raw in c.execute(
        "SELECT namespace, charge FROM objects WHERE tenant=?", (tenant,)
    ).fetchall():
        _bump(c, _BUMP_USED, tenant, ns, json.loads(raw), 1)


def _recount_in_progress(c: sqlite3.Connection, tenant: str | None) -> None:
    """Set `inprog` (of one tenant, or of all) to the sums of the pending reservations."""
    if tenant is None:
        c.execute("DELETE FROM inprog")
        rows = c.execute(
            "SELECT tenant, namespace, charge FROM reservations WHERE state='pending'"
        ).fetchall()
    else:
        c.execute("DELETE FROM inprog WHERE tenant=?", (tenant,))
        rows = c.execute(
            "SELECT tenant, namespace, charge FROM reservations WHERE tenant=? AND state='pending'",
            (tenant,),
        ).fetchall()
    for t, ns, raw in rows:
        _bump(c, _BUMP_INPROG, t, ns, json.loads(raw), 1)


def _upgrade(conn: sqlite3.Connection) -> None:
    """A file from an earlier version (or a new one): fill `inprog` from the pending
    reservations, drop the full claim index (the partial one replaces it) and mark the
    file; once, whichever process gets there first."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] < _SCHEMA_VERSION:
            _recount_in_progress(conn, None)
            conn.execute("DROP INDEX IF EXISTS reservations_claim")
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def _reason(exc: BaseException) -> str:
    """A short public reason for a SQLite/OS failure (no path, no SQLite message)."""
    text = str(exc).lower()
    if "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        return "ledger file is read-only"
    if "locked" in text or "busy" in text:
        return "ledger busy"
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in text:
        return "ledger file is corrupt"
    if "disk is full" in text:
        return "ledger disk is full"
    if "disk i/o error" in text or isinstance(exc, OSError):
        return "ledger write failed"
    return "ledger error"

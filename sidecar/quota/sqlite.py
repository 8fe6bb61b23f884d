"""The embedded SQLite quota ledger (the default, `ledger: sqlite:///path`).

Safe for several sidecar processes on one host sharing the file: every operation is
one `BEGIN IMMEDIATE` transaction (the write lock is taken before the first read, so
two processes can never both pass the same check), the journal is WAL, and a busy
timeout makes a process wait for another's transaction instead of failing. Within a
process, all operations run one at a time on a single worker thread.

Between processes, writers also queue on an `flock` of `<db>.lock`: SQLite's own busy
handler sleeps and retries (up to 100 ms at a time), which under contention from
several processes starved some creates for seconds; the kernel hands an `flock` over
as soon as it is released.

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
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sidecar.quota.ledger import (
    TENANT_SCOPE,
    TOMBSTONE_SECONDS,
    Claim,
    ClaimConflict,
    Clock,
    Ledger,
    LedgerError,
    ObjectRef,
    QuotaExceeded,
    ReconcileResult,
    Reservation,
    Usage,
    charge_delta,
)
from sidecar.quota.meters import Charge

T = TypeVar("T")
log = logging.getLogger("sidecar.quota.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS used (
  tenant TEXT NOT NULL, scope TEXT NOT NULL, resource TEXT NOT NULL, amount INTEGER NOT NULL,
  PRIMARY KEY (tenant, scope, resource));
CREATE TABLE IF NOT EXISTS reservations (
  id TEXT NOT NULL, tenant TEXT NOT NULL, namespace TEXT NOT NULL, charge TEXT NOT NULL,
  state TEXT NOT NULL, expires REAL NOT NULL, claim TEXT NOT NULL DEFAULT '',
  fp TEXT NOT NULL DEFAULT '', PRIMARY KEY (tenant, id));
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
"""
# Files made before claims existed get the two columns (and then the index).
_MIGRATIONS = (
    "ALTER TABLE reservations ADD COLUMN claim TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE reservations ADD COLUMN fp TEXT NOT NULL DEFAULT ''",
)
_CLAIM_INDEX = "CREATE INDEX IF NOT EXISTS reservations_claim ON reservations (tenant, claim)"


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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        # (st_dev, st_ino) of the file this process opened; None until the first open.
        self._file_id: tuple[int, int] | None = None

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
            )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(reservations)")}
            for statement, column in zip(_MIGRATIONS, ("claim", "fp"), strict=True):
                if column not in columns:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process won
                        conn.execute(statement)
            conn.execute(_CLAIM_INDEX)
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
        def tx() -> T:
            conn = self._connect()
            with self._write_lock():
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = fn(conn)
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result

        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, tx)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(_reason(exc), f"sqlite ledger {self.path}: {exc}") from exc

    async def ping(self) -> None:
        await self._run(lambda c: c.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._drop)
        self._executor.shutdown(wait=False)

    # -- helpers (run inside a transaction) ------------------------------------------

    def _purge(self, c: sqlite3.Connection, tenant: str, now: float) -> None:
        c.execute("DELETE FROM reservations WHERE tenant=? AND expires<=?", (tenant, now))

    def _in_progress(self, c: sqlite3.Connection, tenant: str) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for ns, raw in c.execute(
            "SELECT namespace, charge FROM reservations WHERE tenant=? AND state='pending'",
            (tenant,),
        ):
            for res, n in json.loads(raw).items():
                _add(out, TENANT_SCOPE, res, n)
                if ns:
                    _add(out, ns, res, n)
        return out

    def _used(self, c: sqlite3.Connection, tenant: str) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for scope, res, amount in c.execute(
            "SELECT scope, resource, amount FROM used WHERE tenant=?", (tenant,)
        ):
            out.setdefault(scope, {})[res] = amount
        return out

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
        scopes = [TENANT_SCOPE, ns] if ns else [TENANT_SCOPE]
        for scope in scopes:
            for res, n in charge.items():
                c.execute(
                    "INSERT INTO used (tenant, scope, resource, amount) VALUES (?,?,?,MAX(?,0)) "
                    "ON CONFLICT (tenant, scope, resource) DO UPDATE SET "
                    "amount = MAX(amount + ?, 0)",
                    (tenant, scope, res, sign * n, sign * n),
                )

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
        api = self._api_limits(c, tenant)
        used = self._used(c, tenant)
        inprog = self._in_progress(c, tenant)
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
            previous = None
            if claim is not None:
                row = c.execute(
                    "SELECT id, fp, state FROM reservations WHERE tenant=? AND claim=?",
                    (tenant, claim.key),
                ).fetchone()
                if row is not None:
                    if row[1] != claim.fingerprint:
                        return ClaimConflict(in_flight=False)
                    if row[2] == "pending":
                        return ClaimConflict(in_flight=True)
                    previous = row[0]
            refusal = self._check(c, tenant, namespace, charge, tenant_limits, namespace_limits)
            if refusal is not None:
                return refusal
            if previous is not None:
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
                "SELECT state FROM reservations WHERE tenant=? AND id=?", (r.tenant, r.id)
            ).fetchone()
            if row is None or row[0] != "pending":
                return LedgerError("reservation expired")
            c.execute(
                "UPDATE reservations SET charge='{}' WHERE tenant=? AND id=?", (r.tenant, r.id)
            )
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
            c.execute("DELETE FROM reservations WHERE tenant=? AND id=?", (r.tenant, r.id))
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

    async def commit(self, reservation: Reservation, name: str, resource: str) -> bool:
        now = self.clock()
        r = reservation

        def fn(c: sqlite3.Connection) -> bool:
            self._purge(c, r.tenant, now)
            c.execute(
                "UPDATE reservations SET state='committed' WHERE tenant=? AND id=? "
                "AND state='pending'",
                (r.tenant, r.id),
            )
            exists = c.execute(
                "SELECT 1 FROM objects WHERE tenant=? AND namespace=? AND resource=? AND name=?",
                (r.tenant, r.namespace, resource, name),
            ).fetchone()
            if exists:
                return False
            c.execute(
                "INSERT INTO objects (tenant, namespace, resource, name, charge, at) "
                "VALUES (?,?,?,?,?,?)",
                (r.tenant, r.namespace, resource, name, json.dumps(r.charge), now),
            )
            c.execute(
                "DELETE FROM tombstones WHERE tenant=? AND namespace=? AND resource=? AND name=?",
                (r.tenant, r.namespace, resource, name),
            )
            self._apply_used(c, r.tenant, r.namespace, r.charge, 1)
            return True

        return await self._run(fn)

    async def release(self, reservation: Reservation) -> None:
        r = reservation
        await self._run(
            lambda c: c.execute(
                "DELETE FROM reservations WHERE tenant=? AND id=? AND state='pending'",
                (r.tenant, r.id),
            )
        )

    async def delete(self, obj: ObjectRef) -> Charge | None:
        now = self.clock()

        def fn(c: sqlite3.Connection) -> Charge | None:
            key = (obj.tenant, obj.namespace, obj.resource, obj.name)
            row = c.execute(
                "SELECT charge FROM objects WHERE tenant=? AND namespace=? AND resource=? "
                "AND name=?",
                key,
            ).fetchone()
            c.execute(
                "DELETE FROM tombstones WHERE tenant=? AND at<?",
                (obj.tenant, now - TOMBSTONE_SECONDS),
            )
            c.execute("INSERT OR REPLACE INTO tombstones VALUES (?,?,?,?,?)", (*key, now))
            if row is None:
                return None
            charge: Charge = json.loads(row[0])
            c.execute(
                "DELETE FROM objects WHERE tenant=? AND namespace=? AND resource=? AND name=?", key
            )
            self._apply_used(c, obj.tenant, obj.namespace, charge, -1)
            return charge

        return await self._run(fn)

    async def delete_scope(self, tenant: str, namespace: str | None) -> int:
        now = self.clock()

        def fn(c: sqlite3.Connection) -> int:
            if namespace is None:
                rows = c.execute(
                    "SELECT namespace, resource, name FROM objects WHERE tenant=?", (tenant,)
                ).fetchall()
                for table in ("objects", "used", "limits"):
                    c.execute(f"DELETE FROM {table} WHERE tenant=?", (tenant,))
            else:
                rows = c.execute(
                    "SELECT namespace, resource, name, charge FROM objects "
                    "WHERE tenant=? AND namespace=?",
                    (tenant, namespace),
                ).fetchall()
                for ns, _res, _name, raw in rows:
                    self._apply_used(c, tenant, ns, json.loads(raw), -1)
                c.execute("DELETE FROM objects WHERE tenant=? AND namespace=?", (tenant, namespace))
                c.execute("DELETE FROM used WHERE tenant=? AND scope=?", (tenant, namespace))
                c.execute("DELETE FROM limits WHERE tenant=? AND scope=?", (tenant, namespace))
            for row in rows:
                c.execute(
                    "INSERT OR REPLACE INTO tombstones VALUES (?,?,?,?,?)",
                    (tenant, row[0], row[1], row[2], now),
                )
            return len(rows)

        return await self._run(fn)

    async def usage(self, tenant: str) -> Usage:
        now = self.clock()

        def fn(c: sqlite3.Connection) -> Usage:
            self._purge(c, tenant, now)
            return Usage(
                self._used(c, tenant), self._in_progress(c, tenant), self._api_limits(c, tenant)
            )

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
            c.execute("DELETE FROM used WHERE tenant=?", (tenant,))
            for ns, raw in c.execute(
                "SELECT namespace, charge FROM objects WHERE tenant=?", (tenant,)
            ).fetchall():
                self._apply_used(c, tenant, ns, json.loads(raw), 1)
            after = self._used(c, tenant).get(TENANT_SCOPE, {})
            return ReconcileResult(added, removed, changed, before, after)

        return await self._run(fn)


def _reason(exc: BaseException) -> str:
    """A short public reason for a SQLite/OS failure (no path, no SQLite message)."""
    text = str(exc).lower()
    if "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        return "ledger file is read-only"
    if "locked" in text or "busy" in text:
        return "ledger busy"
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in text:
        return "ledger file is corrupt"
    return "ledger error"


def _add(out: dict[str, dict[str, int]], scope: str, res: str, n: Any) -> None:
    inner = out.setdefault(scope, {})
    inner[res] = inner.get(res, 0) + int(n)

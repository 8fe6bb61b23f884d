"""The SQLite ledger's own mechanics (the shared behaviour is in test_ledger.py): group
commit (the operations queued while the ledger thread works share one transaction, a
failing one is rolled back alone, a failed transaction fails them all), the `inprog`
counters (kept in step with the pending reservations, recounted by reconcile, filled
in once for a file of an earlier version), and what stays in `reservations`.

A batch is made deterministic by holding the ledger thread inside an operation that
waits on a threading.Event while the test queues the next operations behind it."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.services.quota.ledger import (
    LedgerError,
    ObjectRef,
    QuotaExceeded,
    Reservation,
    idempotency_claim,
    new_reservation_id,
)
from sidecar.services.quota.sqlite import SqliteLedger
from tests.rigs.clock import FakeClock
from tests.rigs.waiting import eventually

LIMITS = {"servers": 100}


@pytest.fixture
async def led(tmp_path: Path, fake_clock: FakeClock) -> AsyncIterator[SqliteLedger]:
    ledger = SqliteLedger(str(tmp_path / "ledger.db"), 60, fake_clock)
    yield ledger
    await ledger.close()


class Held:
    """The ledger thread held inside an operation until `release()`."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self.started = threading.Event()
        self.go = threading.Event()
        self.task: asyncio.Future[Any] | None = None

    async def __aenter__(self) -> Held:
        def block(_c: sqlite3.Connection) -> None:
            self.started.set()
            self.go.wait(30)

        self.task = asyncio.ensure_future(self.ledger._run(block))
        await eventually(self.started.is_set, what="the ledger thread runs the blocker")
        return self

    async def queued(self, n: int) -> None:
        await eventually(lambda: self.ledger._queue.qsize() == n, what=f"{n} operations queued")

    async def __aexit__(self, *exc: object) -> None:
        self.go.set()
        assert self.task is not None
        await self.task


def reserve(ledger: SqliteLedger, ns: str = "dev", n: int = 1) -> asyncio.Future[Reservation]:
    return asyncio.ensure_future(
        ledger.reserve("acme", ns, {"servers": n}, LIMITS, {}, new_reservation_id())
    )


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


async def test_operations_queued_together_share_one_transaction(led: SqliteLedger) -> None:
    await led.ping()
    batches, operations = led.batches, led.operations
    async with Held(led) as held:
        pending = [
            asyncio.ensure_future(
                led.reserve("acme", "dev", {"servers": 1}, {"servers": 7}, {}, new_reservation_id())
            )
            for _ in range(30)
        ]
        await held.queued(30)
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    # The 30 ran one after another in ONE transaction, and the check stayed exact.
    assert (led.batches, led.operations) == (batches + 2, operations + 31)
    assert sum(isinstance(o, Reservation) for o in outcomes) == 7
    assert sum(isinstance(o, QuotaExceeded) for o in outcomes) == 23
    assert (await led.usage("acme")).get_in_progress("", "servers") == 7


async def test_a_failing_operation_is_rolled_back_alone(led: SqliteLedger, tmp_path: Path) -> None:
    def half_then_fail(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO limits VALUES ('acme', '', 'servers', 1)")
        c.execute("INSERT INTO limits VALUES ('acme', '', 'servers', 1)")  # duplicate key

    async with Held(led) as held:
        first = reserve(led)
        failing = asyncio.ensure_future(led._run(half_then_fail))
        last = reserve(led)
        await held.queued(3)
    with pytest.raises(LedgerError) as info:
        await failing
    assert info.value.reason == "ledger error"
    assert "UNIQUE" in info.value.detail
    r1, r2 = await first, await last
    usage = await led.usage("acme")
    assert usage.get_in_progress("", "servers") == 2
    assert usage.limits == {}  # the failed operation's first write was undone
    assert await led.commit(r1, "a", "servers")
    assert await led.commit(r2, "b", "servers")
    assert (await led.usage("acme")).get_used("dev", "servers") == 2


async def test_a_failed_transaction_fails_every_operation_of_its_batch(
    led: SqliteLedger, tmp_path: Path
) -> None:
    await led.ping()
    async with Held(led) as held:
        pending = [reserve(led) for _ in range(3)]
        await held.queued(3)
        os.remove(tmp_path / "ledger.db")  # noticed before the next batch's transaction
    for outcome in await asyncio.gather(*pending, return_exceptions=True):
        assert isinstance(outcome, LedgerError)
        assert outcome.reason == "ledger file missing"


async def test_an_operation_cancelled_while_queued_never_runs(
    led: SqliteLedger, tmp_path: Path
) -> None:
    async with Held(led) as held:
        cancelled = reserve(led)
        kept = reserve(led)
        await held.queued(2)
        cancelled.cancel()
    await kept
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert (await led.usage("acme")).get_in_progress("", "servers") == 1


async def test_commit_drops_a_reservation_unless_it_holds_a_claim(
    led: SqliteLedger, tmp_path: Path
) -> None:
    for i in range(20):
        r = await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id())
        assert await led.commit(r, f"s{i}", "servers")
    claim = idempotency_claim("acme", "key", "POST", "/servers", b"{}")
    r = await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id(), claim)
    assert await led.commit(r, "claimed", "servers")
    # Only the claim is remembered (until the TTL); the table does not grow with creates.
    assert rows(tmp_path / "ledger.db", "SELECT claim, state FROM reservations") == [
        (claim.key, "committed")
    ]


async def test_in_progress_counters_follow_every_operation(
    led: SqliteLedger, tmp_path: Path, fake_clock: FakeClock
) -> None:
    a = await led.reserve("acme", "dev", {"servers": 1, "requests.cpu": 500}, {}, {}, "a")
    b = await led.reserve("acme", "prod", {"servers": 2}, {}, {}, "b")
    await led.reserve("acme", "dev", {"servers": 4}, {}, {}, "c")
    await led.commit(a, "x", "servers")
    await led.release(b)
    await led.release(b)  # a second release changes nothing
    obj = ObjectRef("acme", "dev", "servers", "x")
    lock = await led.reserve("acme", "dev", {}, {}, {}, "lock", claim=None)
    lock = await led.reserve_change(lock, obj, {"servers": 1, "requests.cpu": 800}, {}, {}, {})
    assert lock.charge == {"requests.cpu": 300}
    usage = await led.usage("acme")
    assert usage.in_progress == {
        "": {"servers": 4, "requests.cpu": 300},
        "dev": {"servers": 4, "requests.cpu": 300},
    }
    await led.commit_change(lock, obj, {"servers": 1, "requests.cpu": 800})
    fake_clock.advance(61)  # "c" expires
    assert (await led.usage("acme")).in_progress == {}
    table = rows(tmp_path / "ledger.db", "SELECT scope, resource, amount FROM inprog")
    assert {amount for _scope, _res, amount in table} == {0}


async def test_reconcile_recounts_drifted_in_progress_counters(
    led: SqliteLedger, tmp_path: Path
) -> None:
    await led.reserve("acme", "dev", {"servers": 2}, LIMITS, {}, new_reservation_id())
    with sqlite3.connect(tmp_path / "ledger.db") as conn:  # e.g. an older sidecar's writes
        conn.execute("UPDATE inprog SET amount = 9")
    assert (await led.usage("acme")).get_in_progress("dev", "servers") == 9
    await led.reconcile_set("acme", ["servers"], {}, 0.0)
    usage = await led.usage("acme")
    assert usage.in_progress == {"": {"servers": 2}, "dev": {"servers": 2}}


OLD_SCHEMA = """
CREATE TABLE used (tenant TEXT NOT NULL, scope TEXT NOT NULL, resource TEXT NOT NULL,
  amount INTEGER NOT NULL, PRIMARY KEY (tenant, scope, resource));
CREATE TABLE reservations (id TEXT NOT NULL, tenant TEXT NOT NULL, namespace TEXT NOT NULL,
  charge TEXT NOT NULL, state TEXT NOT NULL, expires REAL NOT NULL,
  claim TEXT NOT NULL DEFAULT '', fp TEXT NOT NULL DEFAULT '', PRIMARY KEY (tenant, id));
CREATE INDEX reservations_expiry ON reservations (tenant, expires);
CREATE INDEX reservations_claim ON reservations (tenant, claim);
"""


async def test_a_file_of_the_earlier_version_gets_its_counters_once(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        far = fake_clock() + 30
        conn.executemany(
            "INSERT INTO reservations VALUES (?,?,?,?,?,?,?,?)",
            [
                ("p1", "acme", "dev", json.dumps({"servers": 1}), "pending", far, "", ""),
                ("p2", "acme", "", json.dumps({"allocations": 2}), "pending", far, "", ""),
                ("c1", "acme", "dev", json.dumps({"servers": 1}), "committed", far, "k", "f"),
                ("p3", "beta", "ns", json.dumps({"servers": 3}), "pending", far, "", ""),
            ],
        )
    ledger = SqliteLedger(str(path), 60, fake_clock)
    try:
        acme = await ledger.usage("acme")
        assert acme.in_progress == {"": {"servers": 1, "allocations": 2}, "dev": {"servers": 1}}
        assert (await ledger.usage("beta")).get_in_progress("ns", "servers") == 3
        with pytest.raises(QuotaExceeded):  # the counted reservations hold their room
            await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, "n")
    finally:
        await ledger.close()
    indexes = {name for (name,) in rows(path, "SELECT name FROM sqlite_master WHERE type='index'")}
    assert "reservations_claim" not in indexes
    assert "reservations_claimed" in indexes
    assert rows(path, "PRAGMA user_version") == [(2,)]
    # Opened again: counted once, not twice.
    again = SqliteLedger(str(path), 60, fake_clock)
    try:
        assert (await again.usage("acme")).get_in_progress("", "servers") == 1
    finally:
        await again.close()


async def test_closed_ledger_refuses_work(tmp_path: Path) -> None:
    ledger = SqliteLedger(str(tmp_path / "l.db"), 60)
    await ledger.ping()
    await ledger.close()
    await ledger.close()  # twice is fine
    with pytest.raises(LedgerError):
        await ledger.ping()

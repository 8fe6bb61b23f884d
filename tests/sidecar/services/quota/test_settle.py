"""Settling outcomes the sidecar did not see (sidecar/services/quota/settle.py), on a real SQLite
ledger and its fake clock, against a stand-in store: a function answering the settler's
reads from a dict, counting them, as the store's GET of one object would.

The property: a 404 on reading an object back is not proof that the write will never
happen (the upstream may still be making it), so a reservation is committed as soon as
the object is seen, and released on a 404 only once the settling window has passed,
never later than the reservation's expiry; an update's increase stays reserved until
the object is seen with the charge the update gives it, or the window has passed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.services.quota.ledger import Ledger, ObjectRef, new_reservation_id, object_claim
from sidecar.services.quota.settle import Settler
from sidecar.services.quota.sqlite import SqliteLedger
from tests.rigs.clock import FakeClock
from tests.rigs.waiting import eventually

TTL = 300.0
WEB = ObjectRef("acme", "dev", "servers", "web")
POD = ObjectRef("acme", "dev", "pods", "p")


class StandIn:
    """The store, as the settler reads it: objects by path, and the reads counted."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.reads = 0

    async def fetch(self, path: str) -> tuple[int, Any]:
        self.reads += 1
        name = path.rpartition("/")[2]
        if name in self.objects:
            return 200, self.objects[name]
        return 404, {"kind": "Status", "code": 404}

    async def read_again(self, times: int = 2) -> None:
        """Wait until the settler has read `times` more times (each read's answer was
        taken in before the next was sent)."""
        start = self.reads
        await eventually(lambda: self.reads >= start + times, what=f"{times} more reads")


def pod(cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }


@pytest.fixture
async def ledger(tmp_path: Path, fake_clock: FakeClock) -> AsyncIterator[Ledger]:
    ledger = SqliteLedger(str(tmp_path / "ledger.db"), TTL, fake_clock)
    yield ledger
    await ledger.close()


@pytest.fixture
def store() -> StandIn:
    return StandIn()


def settler(ledger: Ledger, store: StandIn, settle_after: float | None) -> Settler:
    return Settler(ledger, store.fetch, settle_after=settle_after)


async def counts(ledger: Ledger, resource: str = "servers") -> tuple[int, int]:
    u = await ledger.usage("acme")
    return u.get_used("", resource), u.get_in_progress("", resource)


async def test_a_create_not_found_yet_stays_reserved_and_is_charged_when_it_appears(
    ledger: Ledger, store: StandIn
) -> None:
    s = settler(ledger, store, 60)
    r = await ledger.reserve(
        "acme", "dev", {"servers": 1}, {"servers": 1}, {}, new_reservation_id()
    )
    try:
        s.settle_create(r, WEB)
        await store.read_again()
        assert await counts(ledger) == (0, 1)  # 404, 404: the upstream may still make it
        store.objects["web"] = {"metadata": {"name": "web"}}
        await eventually(
            lambda: _equal(counts(ledger), (1, 0)), what="committed once the object is seen"
        )
    finally:
        await s.stop()


async def test_a_create_never_found_is_released_once_the_window_has_passed(
    ledger: Ledger, store: StandIn, fake_clock: FakeClock
) -> None:
    s = settler(ledger, store, 60)
    r = await ledger.reserve(
        "acme", "dev", {"servers": 1}, {"servers": 1}, {}, new_reservation_id()
    )
    try:
        s.settle_create(r, WEB)
        await store.read_again()
        fake_clock.advance(59)
        await store.read_again()
        assert await counts(ledger) == (0, 1)
        fake_clock.advance(1)
        await eventually(lambda: _equal(counts(ledger), (0, 0)), what="released")
        assert await ledger.unsettled("acme") == []
    finally:
        await s.stop()


def test_the_window_is_never_longer_than_the_reservation(
    fake_clock: FakeClock, tmp_path: Path
) -> None:
    from sidecar.services.quota.ledger import Reservation

    ledger = SqliteLedger(str(tmp_path / "unused.db"), TTL, fake_clock)
    now = fake_clock()
    made = Reservation("r", "acme", "dev", {"servers": 1}, now - 100)
    never_recorded = Reservation("r", "acme", "dev", {"servers": 1})
    assert Settler(ledger, StandIn().fetch, settle_after=10).release_after(made) == now + 10
    assert Settler(ledger, StandIn().fetch, settle_after=250).release_after(made) == now + 200
    # Unset: until the reservation expires.
    assert Settler(ledger, StandIn().fetch).release_after(made) == now + 200
    assert Settler(ledger, StandIn().fetch).release_after(never_recorded) == now + TTL


async def test_a_sweep_keeps_the_release_time_it_was_marked_with(
    ledger: Ledger, store: StandIn, fake_clock: FakeClock
) -> None:
    """What a process stopped while settling left marked: the next one neither releases
    it at its first 404, nor holds it beyond the window it was marked with."""
    r = await ledger.reserve(
        "acme", "dev", {"servers": 1}, {"servers": 1}, {}, new_reservation_id()
    )
    await ledger.mark_unsettled(r, WEB, fake_clock() + 30)
    s = settler(ledger, store, None)  # its own window would be the TTL
    try:
        assert await s.sweep() == 1
        await store.read_again()
        assert await counts(ledger) == (0, 1)
        fake_clock.advance(30)
        await eventually(lambda: _equal(counts(ledger), (0, 0)), what="released at 30 s")
    finally:
        await s.stop()


async def test_an_update_keeps_its_increase_until_the_store_shows_it(
    ledger: Ledger, store: StandIn, fake_clock: FakeClock
) -> None:
    limits = {"requests.cpu": 4000}
    r = await ledger.reserve("acme", "dev", {"pods": 1, "requests.cpu": 1000}, limits, {}, "c")
    await ledger.commit(r, "p", "pods")
    store.objects["p"] = pod("1")
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, new_reservation_id(), object_claim(POD))
    lock = await ledger.reserve_change(lock, POD, {"pods": 1, "requests.cpu": 3000}, {}, limits, {})
    assert await counts(ledger, "requests.cpu") == (1000, 2000)
    s = settler(ledger, store, 60)
    try:
        s.settle_update(lock, POD, {"pods": 1, "requests.cpu": 3000})
        await store.read_again()
        assert await counts(ledger, "requests.cpu") == (1000, 2000)  # unchanged so far
        store.objects["p"] = pod("3")  # the store applies it now
        await eventually(
            lambda: _equal(counts(ledger, "requests.cpu"), (3000, 0)), what="charged as stored"
        )
    finally:
        await s.stop()


async def test_an_update_that_never_shows_is_settled_as_stored_after_the_window(
    ledger: Ledger, store: StandIn, fake_clock: FakeClock
) -> None:
    limits = {"requests.cpu": 4000}
    r = await ledger.reserve("acme", "dev", {"pods": 1, "requests.cpu": 1000}, limits, {}, "c")
    await ledger.commit(r, "p", "pods")
    store.objects["p"] = pod("1")
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, new_reservation_id(), object_claim(POD))
    lock = await ledger.reserve_change(lock, POD, {"pods": 1, "requests.cpu": 3000}, {}, limits, {})
    s = settler(ledger, store, 60)
    try:
        s.settle_update(lock, POD, {"pods": 1, "requests.cpu": 3000})
        await store.read_again()
        fake_clock.advance(60)
        await eventually(
            lambda: _equal(counts(ledger, "requests.cpu"), (1000, 0)), what="increase returned"
        )
        # The object's claim went with it: another update may go ahead.
        again = await ledger.reserve(
            "acme", "dev", {}, {}, {}, new_reservation_id(), object_claim(POD)
        )
        await ledger.release(again)
    finally:
        await s.stop()


async def _equal(counted: Any, expected: tuple[int, int]) -> bool:
    return bool(await counted == expected)

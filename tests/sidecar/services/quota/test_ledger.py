"""Ledger conformance: the same behaviour from every backend (tests/rigs/ledgers.py
BACKENDS): SQLite, one Redis server, a six-node Redis Cluster (every script on one
slot) and a Sentinel-watched master."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sidecar.services.quota.ledger import (
    MAX_ANSWER_BYTES,
    Answer,
    ClaimConflict,
    ClaimReplay,
    Ledger,
    LedgerError,
    ObjectRef,
    QuotaExceeded,
    Reservation,
    idempotency_claim,
    new_reservation_id,
    object_claim,
)
from tests.rigs.clock import FakeClock


def rid() -> str:
    return new_reservation_id()


async def test_reserve_commit_counts_used(ledger: Ledger) -> None:
    r = await ledger.reserve(
        "acme", "dev", {"servers": 1, "requests.cpu": 500}, {"servers": 2}, {}, rid()
    )
    u = await ledger.usage("acme")
    assert u.get_in_progress("", "servers") == 1
    assert u.get_in_progress("dev", "servers") == 1
    assert u.get_in_progress("", "requests.cpu") == 500
    assert await ledger.commit(r, "web1", "servers") is True
    u = await ledger.usage("acme")
    assert u.get_in_progress("", "servers") == 0
    assert u.get_used("", "servers") == 1
    assert u.get_used("dev", "servers") == 1
    assert u.get_used("dev", "requests.cpu") == 500
    # A second commit of the same object never double-counts.
    assert await ledger.commit(r, "web1", "servers") is False
    assert (await ledger.usage("acme")).get_used("", "servers") == 1


async def test_over_quota_names_scope_and_numbers(ledger: Ledger) -> None:
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid())
    await ledger.commit(r, "a", "servers")
    await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid())
    with pytest.raises(QuotaExceeded) as info:
        await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid())
    e = info.value
    assert (e.scope, e.resource, e.requested, e.used, e.in_progress, e.limit) == (
        "tenant",
        "servers",
        1,
        1,
        1,
        2,
    )


async def test_namespace_refusal_leaves_no_partial_write(ledger: Ledger) -> None:
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 10}, {"servers": 1}, rid())
    await ledger.commit(r, "a", "servers")
    before = await ledger.usage("acme")
    with pytest.raises(QuotaExceeded) as info:
        await ledger.reserve(
            "acme",
            "dev",
            {"servers": 1, "requests.cpu": 100},
            {"servers": 10, "requests.cpu": 1000},
            {"servers": 1},
            rid(),
        )
    assert info.value.scope == "namespace"
    after = await ledger.usage("acme")
    assert after.in_progress == before.in_progress
    assert after.get_in_progress("", "servers") == 0
    assert after.get_in_progress("", "requests.cpu") == 0
    # Another namespace of the same tenant still has room.
    await ledger.reserve("acme", "prod", {"servers": 1}, {"servers": 10}, {}, rid())


async def test_release_returns_capacity_once(ledger: Ledger) -> None:
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())
    await ledger.release(r)
    await ledger.release(r)
    u = await ledger.usage("acme")
    assert u.get_in_progress("", "servers") == 0
    r2 = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())
    assert r2.id != r.id


async def test_reservations_expire_after_ttl(ledger: Ledger, fake_clock: FakeClock) -> None:
    await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())
    with pytest.raises(QuotaExceeded):
        await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())
    fake_clock.advance(ledger.ttl - 1)
    assert (await ledger.usage("acme")).get_in_progress("", "servers") == 1
    fake_clock.advance(2)
    assert (await ledger.usage("acme")).get_in_progress("", "servers") == 0
    await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())


async def test_commit_after_expiry_still_counts_the_object(
    ledger: Ledger, fake_clock: FakeClock
) -> None:
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 5}, {}, rid())
    fake_clock.advance(ledger.ttl + 1)
    assert await ledger.commit(r, "late", "servers") is True
    u = await ledger.usage("acme")
    assert (u.get_used("", "servers"), u.get_in_progress("", "servers")) == (1, 0)


async def test_idempotency_claim_never_skips_the_check(ledger: Ledger) -> None:
    claim = idempotency_claim("acme", "k-1", "POST", "/servers", b'{"a":1}')
    r1 = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid(), claim)
    # In flight: the same request again is refused, nothing new reserved.
    with pytest.raises(ClaimConflict) as exc:
        await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid(), claim)
    assert exc.value.in_flight
    # Another body or path under the same key: refused whatever the state.
    for other in (
        idempotency_claim("acme", "k-1", "POST", "/servers", b'{"a":2}'),
        idempotency_claim("acme", "k-1", "POST", "/configmaps", b'{"a":1}'),
    ):
        with pytest.raises(ClaimConflict) as exc:
            await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid(), other)
        assert not exc.value.in_flight
    assert (await ledger.usage("acme")).get_in_progress("", "servers") == 1
    await ledger.commit(r1, "web", "servers")
    # Committed: a retry is checked and charged like a new create, up to the limit.
    r2 = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid(), claim)
    await ledger.commit(r2, "web-2", "servers")
    with pytest.raises(QuotaExceeded):
        await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid(), claim)
    # Still remembered after the refusal: another body is still refused.
    with pytest.raises(ClaimConflict):
        await ledger.reserve(
            "acme",
            "dev",
            {"servers": 1},
            {"servers": 9},
            {},
            rid(),
            idempotency_claim("acme", "k-1", "POST", "/servers", b"{}"),
        )
    u = await ledger.usage("acme")
    assert (u.get_used("", "servers"), u.get_in_progress("", "servers")) == (2, 0)
    # The key is the caller tenant's: another tenant's identical key is another claim.
    assert idempotency_claim("beta", "k-1", "POST", "/servers", b'{"a":1}').key != claim.key


async def test_released_claim_is_free_again(ledger: Ledger) -> None:
    claim = idempotency_claim("acme", "k", "POST", "/servers", b"{}")
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid(), claim)
    await ledger.release(r)
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid(), claim)
    assert (await ledger.usage("acme")).get_in_progress("", "servers") == 1


async def test_claims_expire_with_their_reservation(ledger: Ledger, fake_clock: FakeClock) -> None:
    claim = idempotency_claim("acme", "k", "POST", "/servers", b"{}")
    await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid(), claim)
    fake_clock.advance(ledger.ttl + 1)
    other = idempotency_claim("acme", "k", "POST", "/servers", b"[]")
    await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid(), other)


async def test_update_reserves_the_increase_and_commits_the_new_charge(ledger: Ledger) -> None:
    limits = {"requests.cpu": 1000}
    obj = ObjectRef("acme", "dev", "pods", "p")
    r = await ledger.reserve("acme", "dev", {"pods": 1, "requests.cpu": 100}, limits, {}, rid())
    await ledger.commit(r, "p", "pods")
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, rid(), object_claim(obj))
    with pytest.raises(ClaimConflict) as exc:
        await ledger.reserve("acme", "dev", {}, {}, {}, rid(), object_claim(obj))
    assert exc.value.in_flight
    with pytest.raises(QuotaExceeded) as refused:
        await ledger.reserve_change(
            lock, obj, {"pods": 1, "requests.cpu": 5_000_000}, {"pods": 1}, limits, {}
        )
    assert refused.value.requested == 5_000_000 - 100
    lock = await ledger.reserve_change(
        lock, obj, {"pods": 1, "requests.cpu": 900}, {"pods": 1}, limits, {}
    )
    assert lock.charge == {"requests.cpu": 800}
    u = await ledger.usage("acme")
    assert (u.get_used("", "requests.cpu"), u.get_in_progress("", "requests.cpu")) == (100, 800)
    await ledger.commit_change(lock, obj, {"pods": 1, "requests.cpu": 900})
    u = await ledger.usage("acme")
    assert (u.get_used("dev", "requests.cpu"), u.get_in_progress("", "requests.cpu")) == (900, 0)
    # A decrease reserves nothing and returns the difference on commit.
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, rid(), object_claim(obj))
    lock = await ledger.reserve_change(lock, obj, {"pods": 1, "requests.cpu": 200}, {}, limits, {})
    assert lock.charge == {}
    await ledger.commit_change(lock, obj, {"pods": 1, "requests.cpu": 200})
    u = await ledger.usage("acme")
    assert (u.get_used("", "requests.cpu"), u.get_used("", "pods")) == (200, 1)
    assert await ledger.delete(obj) == {"pods": 1, "requests.cpu": 200}


async def test_update_of_an_unrecorded_or_deleted_object(ledger: Ledger) -> None:
    obj = ObjectRef("acme", "dev", "pods", "old")
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, rid(), object_claim(obj))
    # Not recorded (made before the ledger): the increase is over its current charge,
    # and the commit records the object with its whole new charge.
    lock = await ledger.reserve_change(
        lock,
        obj,
        {"pods": 1, "requests.cpu": 300},
        {"pods": 1, "requests.cpu": 100},
        {"requests.cpu": 250},
        {},
    )
    assert lock.charge == {"requests.cpu": 200}
    await ledger.commit_change(lock, obj, {"pods": 1, "requests.cpu": 300})
    assert (await ledger.usage("acme")).get_used("", "requests.cpu") == 300
    # Deleted while the update ran: it stays deleted.
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, rid(), object_claim(obj))
    await ledger.delete(obj)
    await ledger.commit_change(lock, obj, {"pods": 1, "requests.cpu": 999})
    u = await ledger.usage("acme")
    assert (u.get_used("", "requests.cpu"), u.get_in_progress("", "requests.cpu")) == (0, 0)


async def test_released_update_frees_its_increase_and_its_claim(ledger: Ledger) -> None:
    obj = ObjectRef("acme", "dev", "pods", "p")
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, rid(), object_claim(obj))
    lock = await ledger.reserve_change(lock, obj, {"pods": 1, "requests.cpu": 50}, {}, {}, {})
    await ledger.release(lock)
    assert (await ledger.usage("acme")).get_in_progress("", "requests.cpu") == 0
    lock = await ledger.reserve("acme", "dev", {}, {}, {}, rid(), object_claim(obj))
    await ledger.release(lock)
    with pytest.raises(LedgerError):
        await ledger.reserve_change(lock, obj, {"pods": 1}, {}, {}, {})


async def test_delete_returns_charge_once(ledger: Ledger) -> None:
    r = await ledger.reserve(
        "acme", "dev", {"servers": 1, "requests.memory": 2048}, {"servers": 1}, {}, rid()
    )
    await ledger.commit(r, "web", "servers")
    obj = ObjectRef("acme", "dev", "servers", "web")
    assert await ledger.delete(obj) == {"servers": 1, "requests.memory": 2048}
    assert await ledger.delete(obj) is None
    u = await ledger.usage("acme")
    assert u.get_used("", "servers") == 0
    assert u.get_used("dev", "requests.memory") == 0
    await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())


async def test_api_limits_override_and_persist(ledger: Ledger) -> None:
    await ledger.set_limit("acme", "", "servers", 1)
    await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 100}, {}, rid())
    with pytest.raises(QuotaExceeded) as info:
        await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 100}, {}, rid())
    assert info.value.limit == 1
    await ledger.set_limit("acme", "dev", "servers", 0)
    u = await ledger.usage("acme")
    assert u.limits == {"": {"servers": 1}, "dev": {"servers": 0}}
    await ledger.set_limit("acme", "", "servers", None)
    assert (await ledger.usage("acme")).limits == {"dev": {"servers": 0}}
    assert "acme" in await ledger.tenants()


async def test_unlimited_resources_still_counted(ledger: Ledger) -> None:
    r = await ledger.reserve("acme", "dev", {"pods": 1}, {}, {}, rid())
    await ledger.commit(r, "p", "pods")
    assert (await ledger.usage("acme")).get_used("", "pods") == 1


async def test_tenant_scoped_objects_count_at_tenant_level(ledger: Ledger) -> None:
    r = await ledger.reserve("acme", "", {"allocations": 1}, {"allocations": 1}, {}, rid())
    await ledger.commit(r, "a1", "allocations")
    u = await ledger.usage("acme")
    assert u.used == {"": {"allocations": 1}}


async def test_delete_scope_namespace_and_tenant(ledger: Ledger) -> None:
    for ns, name in (("dev", "a"), ("dev", "b"), ("prod", "c")):
        r = await ledger.reserve("acme", ns, {"servers": 1}, {}, {}, rid())
        await ledger.commit(r, name, "servers")
    assert await ledger.delete_scope("acme", "dev") == 2
    u = await ledger.usage("acme")
    assert u.get_used("", "servers") == 1
    assert u.get_used("dev", "servers") == 0
    assert await ledger.delete(ObjectRef("acme", "dev", "servers", "a")) is None
    await ledger.set_limit("acme", "", "servers", 3)
    assert await ledger.delete_scope("acme", None) == 1
    u = await ledger.usage("acme")
    assert u.get_used("", "servers") == 0
    assert u.limits == {}


async def test_reconcile_corrects_drift_and_keeps_reservations(
    ledger: Ledger, fake_clock: FakeClock
) -> None:
    for name in ("a", "b", "gone"):
        r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
        await ledger.commit(r, name, "servers")
    pending = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
    fake_clock.advance(1)
    started = fake_clock()
    # Meanwhile (after the listing started): one new commit, one delete.
    fake_clock.advance(1)
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
    await ledger.commit(r, "new", "servers")
    await ledger.delete(ObjectRef("acme", "dev", "servers", "b"))
    listing = {
        ObjectRef("acme", "dev", "servers", "a"): {"servers": 1, "requests.cpu": 250},
        ObjectRef("acme", "dev", "servers", "b"): {"servers": 1},
        ObjectRef("acme", "prod", "servers", "outofband"): {"servers": 1},
    }
    result = await ledger.reconcile_set("acme", ["servers"], listing, started)
    assert (result.added, result.removed, result.changed) == (1, 1, 1)
    u = await ledger.usage("acme")
    # a (corrected), new (committed meanwhile), outofband; b deleted meanwhile, gone gone.
    assert u.get_used("", "servers") == 3
    assert u.get_used("dev", "servers") == 2
    assert u.get_used("prod", "servers") == 1
    assert u.get_used("", "requests.cpu") == 250
    assert u.get_in_progress("", "servers") == 1
    await ledger.release(pending)
    assert (await ledger.usage("acme")).get_in_progress("", "servers") == 0


async def test_reconcile_leaves_other_resources_alone(ledger: Ledger) -> None:
    r = await ledger.reserve("acme", "dev", {"pods": 1}, {}, {}, rid())
    await ledger.commit(r, "p", "pods")
    await ledger.reconcile_set("acme", ["servers"], {}, 0.0)
    assert (await ledger.usage("acme")).get_used("", "pods") == 1


async def test_concurrent_reserves_respect_limit(ledger: Ledger) -> None:
    async def one() -> bool:
        try:
            await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 7}, {}, rid())
            return True
        except QuotaExceeded:
            return False

    results = await asyncio.gather(*(one() for _ in range(30)))
    assert sum(results) == 7


async def test_sqlite_file_faults_fail_closed_without_paths(tmp_path: Path) -> None:
    import os

    from sidecar.services.quota.sqlite import SqliteLedger

    path = tmp_path / "faults" / "ledger.db"
    led = SqliteLedger(str(path), 60)
    try:
        r = await led.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
        await led.commit(r, "a", "servers")
        os.remove(path)
        with pytest.raises(LedgerError) as exc:
            await led.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
        assert str(exc.value) == "ledger file missing"
        assert str(tmp_path) in exc.value.detail
        with pytest.raises(LedgerError):
            await led.ping()
        assert not path.exists()  # never silently recreated empty
        # An operator puts a ledger file back: it is opened.
        other = SqliteLedger(str(path), 60)
        r = await other.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
        await other.commit(r, "b", "servers")
        await other.close()
        await led.ping()
        assert (await led.usage("acme")).get_used("", "servers") == 1
    finally:
        await led.close()


# -- outcomes settled, never assumed (DESIGN §7) ------------------------------------------


async def test_a_release_that_arrives_before_its_reserve_undoes_it(
    ledger: Ledger, fake_clock: FakeClock
) -> None:
    """A reserve whose answer was lost (the ledger stalled past the client's timeout) is
    released by the sidecar; the reserve may reach the ledger only after that."""
    late = rid()
    await ledger.release(Reservation(late, "acme", "dev", {"servers": 1}))
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, late)
    assert r.id == late
    u = await ledger.usage("acme")
    assert u.get_in_progress("", "servers") == 0
    # The id is remembered only until it would have expired; nothing else is held.
    assert await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())
    fake_clock.advance(ledger.ttl + 1)
    assert (await ledger.usage("acme")).get_in_progress("", "servers") == 0
    # Released twice, or after it was committed: no effect.
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid())
    await ledger.commit(r, "kept", "servers")
    await ledger.release(r)
    await ledger.release(r)
    u = await ledger.usage("acme")
    assert (u.get_used("", "servers"), u.get_in_progress("", "servers")) == (1, 0)


async def test_a_reserve_made_again_with_its_id_reserves_once(ledger: Ledger) -> None:
    same = rid()
    for _ in range(3):
        await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 5}, {}, same)
    assert (await ledger.usage("acme")).get_in_progress("", "servers") == 1


async def test_commit_records_the_charge_of_the_object_as_made(ledger: Ledger) -> None:
    r = await ledger.reserve("acme", "dev", {"pods": 1, "requests.cpu": 100}, {}, {}, rid())
    assert await ledger.commit(r, "p", "pods", {"pods": 1, "requests.cpu": 400}) is True
    u = await ledger.usage("acme")
    assert u.get_used("dev", "requests.cpu") == 400
    assert u.get_in_progress("", "requests.cpu") == 0
    assert await ledger.delete(ObjectRef("acme", "dev", "pods", "p")) == {
        "pods": 1,
        "requests.cpu": 400,
    }
    assert (await ledger.usage("acme")).get_used("", "requests.cpu") == 0


async def test_a_committed_claim_replays_its_answer_whatever_the_quota(ledger: Ledger) -> None:
    claim = idempotency_claim("acme", "k", "POST", "/servers", b'{"n":1}')
    answer = Answer(201, "application/json", b'{"metadata":{"name":"web"}}')
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid(), claim)
    await ledger.commit(r, "web", "servers", answer=answer)
    for _ in range(2):  # full up, and again
        with pytest.raises(ClaimReplay) as replay:
            await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 1}, {}, rid(), claim)
        assert replay.value.answer == answer
    u = await ledger.usage("acme")
    assert (u.get_used("", "servers"), u.get_in_progress("", "servers")) == (1, 0)
    # Another body under the key is still a conflict, not a replay.
    with pytest.raises(ClaimConflict):
        await ledger.reserve(
            "acme",
            "dev",
            {"servers": 1},
            {"servers": 9},
            {},
            rid(),
            idempotency_claim("acme", "k", "POST", "/servers", b'{"n":2}'),
        )
    # An answer too large to keep is not replayed: the retry is checked like any create.
    big = idempotency_claim("acme", "big", "POST", "/servers", b"{}")
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid(), big)
    await ledger.commit(
        r, "big", "servers", answer=Answer(201, "application/json", b"x" * (MAX_ANSWER_BYTES + 1))
    )
    with pytest.raises(QuotaExceeded):
        await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 2}, {}, rid(), big)


async def test_unsettled_reservations_are_listed_until_settled(
    ledger: Ledger, fake_clock: FakeClock
) -> None:
    made = ObjectRef("acme", "dev", "servers", "web")
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 5}, {}, rid())
    assert await ledger.unsettled("acme") == []
    await ledger.mark_unsettled(r, made, fake_clock() + 5)
    [(listed, obj, release_after)] = await ledger.unsettled("acme")
    assert (listed.id, listed.charge, obj) == (r.id, {"servers": 1}, made)
    assert abs(listed.created - r.created) < 1
    # The time from which a 404 may release it travels with the mark.
    assert release_after == fake_clock() + 5
    # Still counted while unsettled.
    assert (await ledger.usage("acme")).get_in_progress("dev", "servers") == 1
    await ledger.commit(listed, "web", "servers")
    assert await ledger.unsettled("acme") == []
    # Released, or expired: no longer listed; a mark on a settled one does nothing.
    r2 = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 5}, {}, rid())
    await ledger.mark_unsettled(r2, ObjectRef("acme", "dev", "servers", "two"))
    await ledger.release(r2)
    await ledger.mark_unsettled(r2, ObjectRef("acme", "dev", "servers", "two"))
    assert await ledger.unsettled("acme") == []
    r3 = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 5}, {}, rid())
    await ledger.mark_unsettled(r3, ObjectRef("acme", "dev", "servers", "three"))
    fake_clock.advance(ledger.ttl + 1)
    assert await ledger.unsettled("acme") == []
    u = await ledger.usage("acme")
    assert (u.get_used("", "servers"), u.get_in_progress("", "servers")) == (1, 0)


async def test_a_mark_without_a_release_time_releases_when_the_reservation_expires(
    ledger: Ledger, fake_clock: FakeClock
) -> None:
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {"servers": 5}, {}, rid())
    await ledger.mark_unsettled(r, ObjectRef("acme", "dev", "servers", "web"))
    [(_, _, release_after)] = await ledger.unsettled("acme")
    assert abs(release_after - (r.created + ledger.ttl)) < 1


async def test_a_delete_made_again_later_takes_no_charge_of_an_object_made_since(
    ledger: Ledger, fake_clock: FakeClock
) -> None:
    """A delete whose answer was lost is made again once the ledger answers, at the time
    it happened: by then the same name may hold another object, whose charge stays."""
    obj = ObjectRef("acme", "dev", "servers", "web")
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
    await ledger.commit(r, "web", "servers")
    deleted_at = fake_clock()
    fake_clock.advance(5)
    # The first attempt may have run after all: the repeat returns nothing more.
    assert await ledger.delete(obj, deleted_at) == {"servers": 1}
    assert await ledger.delete(obj, deleted_at) is None
    assert (await ledger.usage("acme")).get_used("", "servers") == 0
    # Made again, and deleted again with the ledger failing: before the delete is
    # recorded, an object of the same name is made a third time. Its commit replaces
    # the record left over (the count stays right, with the new object's charge)…
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
    assert await ledger.commit(r, "web", "servers") is True
    deleted_at = fake_clock()
    fake_clock.advance(5)
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
    assert await ledger.commit(r, "web", "servers", {"servers": 1, "requests.cpu": 500}) is True
    assert await ledger.commit(r, "web", "servers") is False
    u = await ledger.usage("acme")
    assert (u.get_used("dev", "servers"), u.get_used("", "requests.cpu")) == (1, 500)
    # …and the delete, recorded at last, leaves the new object's charge alone.
    fake_clock.advance(5)
    assert await ledger.delete(obj, deleted_at) is None
    u = await ledger.usage("acme")
    assert (u.get_used("dev", "servers"), u.get_used("", "requests.cpu")) == (1, 500)
    # Deleted now: its charge comes back.
    assert await ledger.delete(obj) == {"servers": 1, "requests.cpu": 500}
    assert (await ledger.usage("acme")).get_used("", "servers") == 0


async def test_a_scope_delete_made_again_later_keeps_objects_made_since(
    ledger: Ledger, fake_clock: FakeClock
) -> None:
    for name in ("a", "b"):
        r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
        await ledger.commit(r, name, "servers")
    r = await ledger.reserve("acme", "prod", {"servers": 1}, {}, {}, rid())
    await ledger.commit(r, "c", "servers")
    deleted_at = fake_clock()
    fake_clock.advance(5)
    # The namespace is made again and holds a new object before the delete is recorded.
    r = await ledger.reserve("acme", "dev", {"servers": 1}, {}, {}, rid())
    await ledger.commit(r, "a", "servers")
    assert await ledger.delete_scope("acme", "dev", deleted_at) == 1
    assert await ledger.delete_scope("acme", "dev", deleted_at) == 0
    u = await ledger.usage("acme")
    assert (u.get_used("", "servers"), u.get_used("dev", "servers")) == (2, 1)
    assert u.get_used("prod", "servers") == 1
    # The tenant: everything recorded before its delete goes.
    assert await ledger.delete_scope("acme", None, deleted_at) == 1
    u = await ledger.usage("acme")
    assert (u.get_used("", "servers"), u.get_used("dev", "servers")) == (1, 1)
    assert await ledger.delete_scope("acme", None) == 1
    assert (await ledger.usage("acme")).get_used("", "servers") == 0

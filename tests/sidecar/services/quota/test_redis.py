"""The Redis ledger's own mechanics (the shared behaviour is in test_ledger.py), on the
real Redis under this test's own key prefix, and on the session's Redis Cluster and
Sentinel set: what a commit keeps of a reservation, `tenants()` found by a SCAN of every
master, a retried reserve, readiness words, a fresh cluster client's first burst, and an
unreachable topology failing as a LedgerError."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from sidecar.services.quota.ledger import (
    ClaimConflict,
    LedgerError,
    idempotency_claim,
    new_reservation_id,
)
from sidecar.services.quota.redis import RedisLedger
from tests.rigs.clock import FakeClock
from tests.rigs.ledgers import redis_url_for
from tests.rigs.processes import free_port
from tests.rigs.redis_topologies import SENTINEL_PASSWORD, RedisClusterRig

LIMITS = {"servers": 100}


@pytest.fixture
async def led(
    redis_url: str, redis_prefix: str, fake_clock: FakeClock
) -> AsyncIterator[RedisLedger]:
    ledger = RedisLedger(redis_url, 60, fake_clock, prefix=redis_prefix)
    yield ledger
    await ledger.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_commit_drops_a_reservation_unless_it_holds_a_claim(
    led: RedisLedger, raw: aioredis.Redis, redis_prefix: str
) -> None:
    for i in range(5):
        r = await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id())
        assert await led.commit(r, f"s{i}", "servers")
    claim = idempotency_claim("acme", "key", "POST", "/servers", b"{}")
    kept = await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id(), claim)
    assert await led.commit(kept, "claimed", "servers")
    base = f"{redis_prefix}{{acme}}:"
    assert await raw.hkeys(base + "res") == [kept.id]
    assert await raw.zrange(base + "resexp", 0, -1) == [kept.id]
    usage = await led.usage("acme")
    assert (usage.get_used("", "servers"), usage.get_in_progress("", "servers")) == (6, 0)
    # The claim is still remembered: the same key for another request is refused.
    other = idempotency_claim("acme", "key", "POST", "/servers", b'{"other": 1}')
    with pytest.raises(ClaimConflict) as info:
        await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id(), other)
    assert info.value.in_flight is False


REDIS_KINDS = ["redis", "redis-cluster", "redis-sentinel"]


@pytest.fixture(params=REDIS_KINDS)
async def any_led(
    request: pytest.FixtureRequest, fake_clock: FakeClock
) -> AsyncIterator[tuple[str, RedisLedger]]:
    """(kind, a ledger on it) for one server, the Redis Cluster and the Sentinel set."""
    kind = request.param
    url = redis_url_for(kind, request)
    prefix = request.getfixturevalue("redis_prefix" if kind == "redis" else "topology_prefix")
    ledger = RedisLedger(url, 60, fake_clock, prefix=prefix)
    yield kind, ledger
    await ledger.close()


async def test_tenants_are_found_on_every_master(
    any_led: tuple[str, RedisLedger], request: pytest.FixtureRequest
) -> None:
    kind, led = any_led
    names = [f"t{i}" for i in range(24)]
    for t in names:
        await led.reserve(t, "", {"servers": 1}, LIMITS, {}, new_reservation_id())
    await led.set_limit("limited-only", "", "servers", 3)
    assert await led.tenants() == sorted([*names, "limited-only"])
    if kind == "redis-cluster":  # the tenants live on several masters, all were scanned
        rig = request.getfixturevalue("redis_cluster")
        masters = {rig.master_of(f"{{{t}}}").port for t in names}
        assert len(masters) == 3


async def test_a_retried_reserve_reserves_once(
    any_led: tuple[str, RedisLedger],
) -> None:
    """A client retries a call whose reply it lost (a reconnection, a failover): the
    same reservation id must not be charged twice, nor refuse itself as in flight."""
    _, led = any_led
    claim = idempotency_claim("acme", "key", "POST", "/servers", b"{}")
    rid = new_reservation_id()
    first = await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, rid, claim)
    again = await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, rid, claim)
    assert again.id == first.id
    assert (await led.usage("acme")).get_in_progress("", "servers") == 1
    await led.release(first)
    assert (await led.usage("acme")).get_in_progress("", "servers") == 0


async def test_ready_names_the_topology_and_its_state(
    any_led: tuple[str, RedisLedger], request: pytest.FixtureRequest
) -> None:
    kind, led = any_led
    ok, detail = await led.ready()
    assert ok, detail
    if kind == "redis-cluster":
        assert detail == "ledger redis+cluster: 3 masters ok"
    elif kind == "redis-sentinel":
        port = request.getfixturevalue("redis_sentinel").master().port
        assert detail == f"ledger redis+sentinel mymaster: master 127.0.0.1:{port} ok"
        assert SENTINEL_PASSWORD not in detail
    else:
        assert detail.startswith("ledger redis "), detail
        assert detail.endswith(": reachable"), detail


async def test_a_fresh_cluster_ledgers_first_burst_is_answered(
    redis_cluster: RedisClusterRig, topology_prefix: str, fake_clock: FakeClock
) -> None:
    """Many first calls at once on a new cluster client (a sidecar just started under
    load): each is answered (redis-py's client, left to learn the cluster from the burst
    itself, handed some calls a closed connection: AttributeError, a 500)."""
    for _ in range(3):
        led = RedisLedger(redis_cluster.url, 60, fake_clock, prefix=topology_prefix)
        try:
            got = await asyncio.gather(
                *(
                    led.reserve("burst", "", {"servers": 1}, {"servers": 1000}, {}, rid)
                    for rid in [new_reservation_id() for _ in range(60)]
                ),
                return_exceptions=True,
            )
        finally:
            await led.close()
        assert [g for g in got if isinstance(g, BaseException)] == []


@pytest.mark.parametrize("form", ["cluster", "sentinel"])
async def test_an_unreachable_topology_is_a_ledger_error(form: str, fake_clock: FakeClock) -> None:
    hosts = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    url = f"redis+{form}://:pw@{hosts}" + ("/mymaster" if form == "sentinel" else "")
    led = RedisLedger(url, 60, fake_clock, timeout=0.5)
    try:
        with pytest.raises(LedgerError) as info:
            await led.reserve("acme", "", {"servers": 1}, LIMITS, {}, new_reservation_id())
        assert info.value.reason == "ledger unreachable"
        with pytest.raises(LedgerError):
            await led.tenants()
        with pytest.raises(LedgerError):
            await led.ping()
        ok, detail = await led.ready()
        assert not ok
        assert detail.startswith(f"ledger unavailable: redis+{form}")
        assert "pw" not in detail
    finally:
        await led.close()

"""The Redis ledger's own mechanics (the shared behaviour is in test_ledger.py), on the
real Redis under this test's own key prefix: what a commit keeps of a reservation, and
the `tenants` index a reserve refreshes at most every INDEX_REFRESH seconds."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from sidecar.quota import redis as redis_ledger
from sidecar.quota.ledger import ClaimConflict, idempotency_claim, new_reservation_id
from sidecar.quota.redis import RedisLedger
from tests.rigs.clock import FakeClock

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


async def test_reserve_indexes_its_tenant_once_per_refresh(
    led: RedisLedger,
    raw: aioredis.Redis,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id())
    assert await led.tenants() == ["acme"]
    await raw.delete(f"{redis_prefix}tenants")  # e.g. deleted by hand
    # Within the refresh interval a reserve does not add it again (no extra round trip)...
    await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id())
    assert await led.tenants() == []
    # ...after it, it does.
    monkeypatch.setattr(redis_ledger, "INDEX_REFRESH", 0.0)
    await led.reserve("acme", "dev", {"servers": 1}, LIMITS, {}, new_reservation_id())
    assert await led.tenants() == ["acme"]
    # set_limit always indexes.
    await raw.delete(f"{redis_prefix}tenants")
    monkeypatch.setattr(redis_ledger, "INDEX_REFRESH", 60.0)
    await led.set_limit("acme", "", "servers", 5)
    assert await led.tenants() == ["acme"]

"""The local tier: token buckets with an injected clock (no sleeps), the LRU,
reload without a free burst, exact Retry-After, and flat memory with 1M tenants."""

from __future__ import annotations

import gc
import os

import pytest

from sidecar.policy.ratelimits import Rate
from sidecar.ratelimit.inflight import InFlight
from sidecar.ratelimit.local import LocalLimiter, Verdict
from tests.rigs.clock import FakeClock


async def take(limiter: LocalLimiter, key: str, spec: Rate) -> Verdict:
    verdict = await limiter.acquire([(key, spec)])
    assert verdict is not None
    return verdict


async def test_burst_then_steady_rate() -> None:
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(100, clock)
    spec = Rate(rate=2.0, burst=5)
    results = [(await take(limiter, "acme", spec)).allowed for _ in range(8)]
    assert results == [True] * 5 + [False] * 3
    # Then exactly `rate` per second, whatever the offered load.
    admitted = 0
    for _ in range(10):  # 10 seconds, 20 attempts per second
        for _ in range(20):
            clock.advance(0.05)
            admitted += (await take(limiter, "acme", spec)).allowed
    assert admitted == 20


async def test_headers_count_down_and_reset() -> None:
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(100, clock)
    spec = Rate(rate=1.0, burst=3)
    first = await take(limiter, "acme", spec)
    assert (first.limit, first.remaining, first.reset) == (3, 2, 1)
    await take(limiter, "acme", spec)
    third = await take(limiter, "acme", spec)
    assert (third.remaining, third.reset) == (0, 3)
    headers = third.headers()
    assert headers["RateLimit-Limit"] == "3"
    assert headers["RateLimit-Remaining"] == "0"
    assert headers["RateLimit-Reset"] == "3"
    assert "Retry-After" not in headers


@pytest.mark.parametrize(
    ("rate", "burst", "used", "expected"),
    [
        (1.0, 2, 2, 1),  # one token back after exactly 1 s
        (0.5, 1, 1, 2),  # 2 s per token
        (3.0, 3, 3, 1),  # 1/3 s rounds up to 1
        (0.1, 4, 4, 10),  # 10 s per token, float rate
        (0.3, 2, 2, 4),  # 3.33 s rounds up to 4
        (7.0, 10, 10, 1),
    ],
)
async def test_retry_after_is_exact_and_accurate(
    rate: float, burst: int, used: int, expected: int
) -> None:
    clock = FakeClock(12345.678)
    limiter = LocalLimiter(100, clock)
    spec = Rate(rate, burst)
    for _ in range(used):
        assert (await take(limiter, "t", spec)).allowed
    refused = await take(limiter, "t", spec)
    assert not refused.allowed
    assert refused.retry_after == expected
    assert refused.headers()["Retry-After"] == str(expected)
    # One second less than the advice is too early (when the advice is > 1 s) ...
    if expected > 1:
        clock.advance(expected - 1)
        assert not (await take(limiter, "t", spec)).allowed
        clock.advance(1)
    else:
        clock.advance(expected)
    # ... and waiting what we were told gets through.
    assert (await take(limiter, "t", spec)).allowed


async def test_refusal_consumes_nothing() -> None:
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(100, clock)
    spec = Rate(1.0, 1)
    assert (await take(limiter, "t", spec)).allowed
    for _ in range(50):
        assert not (await take(limiter, "t", spec)).allowed
    clock.advance(1.0)
    assert (await take(limiter, "t", spec)).allowed


async def test_several_buckets_all_or_nothing() -> None:
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(100, clock)
    tenant, user = Rate(10.0, 10), Rate(1.0, 1)
    keys = [(("acme", "all"), tenant), (("acme", "u:alice"), user)]
    first = await limiter.acquire(keys)
    assert first is not None
    assert first.allowed
    assert first.limit == 1
    assert first.remaining == 0
    second = await limiter.acquire(keys)
    assert second is not None
    assert not second.allowed
    assert second.retry_after == 1
    # The refused request took nothing from the tenant bucket: 9 left for others.
    bob = [(("acme", "all"), tenant), (("acme", "u:bob"), Rate(100.0, 100))]
    results = [(await limiter.acquire(bob)) for _ in range(10)]
    assert [v is not None and v.allowed for v in results] == [True] * 9 + [False]


async def test_lru_eviction_is_bounded_and_recreates_full() -> None:
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(2, clock)
    spec = Rate(1.0, 1)
    assert (await take(limiter, "a", spec)).allowed
    assert not (await take(limiter, "a", spec)).allowed
    assert (await take(limiter, "b", spec)).allowed
    assert (await take(limiter, "c", spec)).allowed  # evicts "a", the least recently used
    assert len(limiter.buckets) == 2
    assert "a" not in limiter.buckets
    assert (await take(limiter, "a", spec)).allowed  # a fresh, full bucket
    assert "b" not in limiter.buckets


async def test_reload_keeps_level_no_free_burst() -> None:
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(100, clock)
    old = Rate(1.0, 10)
    for _ in range(10):
        assert (await take(limiter, "t", old)).allowed
    # New policy: bigger burst. The bucket keeps its level (10 used), so only the
    # new headroom (20 - 10) is available, not a fresh burst of 20.
    new = Rate(1.0, 20)
    results = [(await take(limiter, "t", new)).allowed for _ in range(12)]
    assert results == [True] * 10 + [False] * 2
    # Smaller burst than the level: nothing left, and the wait is bounded by the new size.
    small = Rate(1.0, 5)
    refused = await take(limiter, "t", small)
    assert not refused.allowed
    assert refused.retry_after == 1


async def test_max_wait_waits_for_a_token_within_the_bound() -> None:
    limiter = LocalLimiter(10)  # the event loop's clock: a real (short) wait
    spec = Rate(200.0, 1)
    assert (await limiter.acquire([("t", spec)], max_wait=0.5)) is not None
    waited = await limiter.acquire([("t", spec)], max_wait=0.5)
    assert waited is not None
    assert waited.allowed
    # A wait longer than max_wait is refused at once.
    slow = Rate(0.01, 1)
    assert (await limiter.acquire([("s", slow)], max_wait=0.5)) is not None
    refused = await limiter.acquire([("s", slow)], max_wait=0.5)
    assert refused is not None
    assert not refused.allowed
    assert refused.retry_after == 100


def test_inflight_counts_and_forgets() -> None:
    inflight = InFlight()
    assert inflight.try_enter("acme", 2)
    assert inflight.try_enter("acme", 2)
    assert not inflight.try_enter("acme", 2)
    assert inflight.try_enter("beta", 2)
    inflight.leave("acme")
    assert inflight.try_enter("acme", 2)
    for _ in range(2):
        inflight.leave("acme")
    inflight.leave("beta")
    assert inflight.counts == {}


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


async def test_memory_flat_with_a_million_tenants() -> None:
    """1,000,000 distinct tenants through a 20,000-bucket LRU: the process's resident
    memory stays at the level reached once the LRU is full."""
    clock = FakeClock(1000.0)
    cap = 20_000
    limiter = LocalLimiter(cap, clock)
    spec = Rate(5.0, 10)
    inflight = InFlight()

    async def tenants(start: int, stop: int) -> None:
        for i in range(start, stop):
            key = f"tenant-{i}"
            inflight.enter(key)
            await limiter.acquire([((key, "all"), spec)])
            inflight.leave(key)
            clock.advance(0.0001)

    gc.collect()
    base = rss_bytes()
    await tenants(0, 2 * cap)
    gc.collect()
    full = rss_bytes() - base
    await tenants(2 * cap, 1_000_000)
    gc.collect()
    after = rss_bytes() - base
    assert len(limiter.buckets) == cap
    assert inflight.counts == {}
    print(
        f"\nrate-limit memory (RSS growth): {full / 1e6:.1f} MB with the LRU full "
        f"({cap} buckets), {after / 1e6:.1f} MB after 1,000,000 tenants"
    )
    assert full > 4_000_000  # the LRU's contents are visible in the measurement
    assert after < 1.5 * full

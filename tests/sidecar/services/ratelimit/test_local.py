"""The local tier: token buckets with an injected clock (no sleeps), the LRU and its
eviction, reload without a free burst, exact Retry-After, a bucket store the garbage
collector does not scan, and flat memory with 1M tenants (counted, not timed)."""

from __future__ import annotations

import gc
import sys

import pytest

from sidecar.policy.kinds.ratelimits import Rate
from sidecar.services.ratelimit.inflight import InFlight
from sidecar.services.ratelimit.local import BucketAnswer, LocalLimiter
from tests.rigs.clock import FakeClock


async def take(limiter: LocalLimiter, key: str, spec: Rate) -> BucketAnswer:
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
    keys = [("acme/all", tenant), ("acme/u:alice", user)]
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
    bob = [("acme/all", tenant), ("acme/u:bob", Rate(100.0, 100))]
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


async def test_reload_to_a_slower_rate_keeps_the_tokens_in_use() -> None:
    """The tokens in use carry over to the new rate: the bucket is not re-read as
    "full again in the same time", which at a tenth of the rate would free 9 of 10."""
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(100, clock)
    for _ in range(10):
        assert (await take(limiter, "t", Rate(10.0, 10))).allowed
    slow = Rate(1.0, 10)
    refused = await take(limiter, "t", slow)
    assert not refused.allowed
    assert (refused.remaining, refused.reset, refused.retry_after) == (0, 10, 1)
    clock.advance(1.0)  # one token back at the new rate, and only one
    assert [(await take(limiter, "t", slow)).allowed for _ in range(2)] == [True, False]


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


def test_refusals_and_looks_store_no_bucket() -> None:
    """A bucket not in the LRU is full: only taking a token stores one, so refusals
    and header reads never grow the LRU."""
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(100, clock)
    spec = Rate(1.0, 1)
    peeked = limiter.peek([("t", spec)])
    assert peeked is not None
    assert (peeked.remaining, peeked.reset) == (1, 0)
    assert len(limiter.buckets) == 0
    assert limiter.try_acquire([("t", spec)]) == BucketAnswer(True, 1, 0, 1, window=1.0)
    assert len(limiter.buckets) == 1
    # Two buckets, one of them short: the refusal takes nothing and stores nothing.
    refused = limiter.try_acquire([("u", Rate(5.0, 5)), ("t", spec)])
    assert refused is not None
    assert not refused.allowed
    assert "u" not in limiter.buckets


def test_evicting_a_full_bucket_changes_nothing() -> None:
    """A one-bucket LRU (every other tenant's request evicts the bucket) answers
    exactly as an LRU that keeps every bucket, as long as a bucket is full again by
    the time it is evicted: the state DESIGN §6 relies on."""
    spec = Rate(2.0, 3)
    clocks = FakeClock(1000.0), FakeClock(1000.0)
    small, large = LocalLimiter(1, clocks[0]), LocalLimiter(100, clocks[1])
    answers: list[list[BucketAnswer | None]] = [[], []]
    for round_ in range(6):
        for tenant in ("a", "b", "c"):
            for limiter, clock, out in zip((small, large), clocks, answers, strict=True):
                # A burst that empties the bucket (and is refused once) ...
                out += [limiter.try_acquire([(tenant, spec)]) for _ in range(4)]
                # ... then long enough for it to be full again.
                clock.advance(1.5 + round_ * 0.1)
    assert answers[0] == answers[1]
    assert [v is not None and v.allowed for v in answers[0][:4]] == [True] * 3 + [False]
    assert len(small.buckets) == 1


def collector_work() -> int:
    """What a full collection goes through: the objects the cyclic garbage collector
    tracks (frozen ones aside) and the references it follows from them."""
    return sum(1 + len(gc.get_referents(o)) for o in gc.get_objects())


def test_bucket_store_is_invisible_to_the_garbage_collector() -> None:
    """The LRU holds strings and complex numbers only, which the cyclic collector does
    not track, so its dict is never tracked either: a full collection neither scans
    the buckets nor follows a reference to one, however many there are (an object
    per bucket made each pause grow with the tenants)."""
    clock = FakeClock(1000.0)
    limiter = LocalLimiter(10_000, clock)
    spec, users = Rate(5.0, 10), Rate(1.0, 2)
    gc.collect()
    gc.freeze()  # as the sidecar does once started (sidecar/policy/source/reload.py)
    try:
        before = collector_work()
        for i in range(1_000):
            tenant = f"tenant-{i}"
            limiter.try_acquire([(f"{tenant}/all", spec), (f"{tenant}/u:user-{i}", users)])
        # A reload re-sizes a bucket: what it stores is plain numbers too.
        limiter.try_acquire([("tenant-0/all", Rate(3.0, 4))])
        gc.collect()
        after = collector_work()
    finally:
        gc.unfreeze()
    assert len(limiter.buckets) == 2_000
    for key in list(limiter.buckets):
        assert not gc.is_tracked(key)
        assert not gc.is_tracked(limiter.buckets[key])
    assert after - before < 100


def test_memory_flat_with_a_million_tenants() -> None:
    """1,000,000 distinct tenants through a 20,000-bucket LRU: once the LRU is full,
    neither the memory blocks allocated nor the objects the garbage collector tracks
    grow. Counted, not timed: the same run gives the same counts on any machine, at
    any load."""
    clock = FakeClock(1000.0)
    cap = 20_000
    limiter = LocalLimiter(cap, clock)
    spec = Rate(5.0, 10)
    inflight = InFlight()

    def tenants(start: int, stop: int) -> None:
        for i in range(start, stop):
            key = f"tenant-{i}"
            inflight.enter(key)
            limiter.try_acquire([(f"{key}/all", spec)])
            inflight.leave(key)
            clock.advance(0.0001)

    def counts() -> tuple[int, int]:
        gc.collect()
        return sys.getallocatedblocks(), len(gc.get_objects())

    blocks0, tracked0 = counts()
    tenants(0, 2 * cap)
    blocks_full, tracked_full = counts()
    tenants(2 * cap, 1_000_000)
    blocks_after, tracked_after = counts()
    assert len(limiter.buckets) == cap
    assert inflight.counts == {}
    print(
        f"\nrate-limit LRU of {cap} buckets: {blocks_full - blocks0} memory blocks and "
        f"{tracked_full - tracked0} tracked objects when full, "
        f"{blocks_after - blocks0} and {tracked_after - tracked0} after 1,000,000 tenants"
    )
    # The blocks see the buckets (a key, its tenant name, a state and its clock reading
    # each) ...
    assert blocks_full - blocks0 >= 3 * cap
    # ... and stay where a full LRU put them (a few blocks of slack for free lists).
    assert blocks_after - blocks_full < 100
    # No object per bucket for the collector to scan, then or after.
    assert tracked_full - tracked0 < 100
    assert tracked_after - tracked0 < 100

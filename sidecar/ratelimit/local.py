"""The local rate-limit tier: aiolimiter buckets in a bounded LRU, per process.

Owns the bucket (aiolimiter's leaky bucket, level = tokens in use), bucket lookup
(creating a bucket full, re-sizing it on a policy reload without a free burst), the
check-then-take of several buckets at once, the
bounded wait (`rateLimit.maxWait`), and the numbers behind the 429 headers. A bucket
evicted from the LRU is recreated full; the LRU evicts the least recently used, i.e.
the buckets most likely to have refilled already.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from aiolimiter import AsyncLimiter
from cachetools import LRUCache

from sidecar.policy.ratelimits import Rate

Clock = Callable[[], float]

# Tolerance, in tokens, for float rounding: a client that waits exactly the
# Retry-After it was given must get through, whatever the clock's float error.
_EPS = 1e-6


class Bucket(AsyncLimiter):
    """A token bucket of `rate.burst` tokens refilled at `rate.rate` per second.

    aiolimiter's leaky bucket (DESIGN §6) with level = tokens in use. It reads and
    sets aiolimiter's private `_level`/`_last_check`/`_rate_per_sec`, which aiolimiter
    offers no public way to (the 429 headers need the level, a policy reload must carry
    it over, tests inject a clock): aiolimiter is pinned below its next minor release
    and tests/system/test_dependency_contracts.py fails by name if those change.
    `clock` replaces the event loop's clock; None keeps aiolimiter's own.
    """

    __slots__ = ("_clock", "spec")

    def __init__(self, spec: Rate, clock: Clock | None = None) -> None:
        super().__init__(spec.burst, spec.burst / spec.rate)
        self.spec = spec
        self._clock = clock

    def _leak(self) -> None:
        if self._clock is None:
            super()._leak()
            return
        now = self._clock()
        if self._level:
            elapsed = now - self._last_check
            self._level = max(self._level - elapsed * self._rate_per_sec, 0.0)
        self._last_check = now

    def take(self, amount: float = 1) -> None:
        """Use `amount` tokens at once (callers check `has_capacity` first; unlike
        `acquire`, this never waits, so check-then-take never yields)."""
        self._leak()
        self._level += amount

    def has_capacity(self, amount: float = 1) -> bool:
        self._leak()
        level: float = self._level
        return level + amount <= self.max_rate + _EPS

    def level(self) -> float:
        """Tokens in use now (0 = full bucket)."""
        self._leak()
        level: float = self._level
        return level

    def carry_level_from(self, old: Bucket) -> None:
        """Take over an older bucket's level (policy reload): no free burst."""
        level = old.level()
        self._leak()
        self._level = min(level, float(self.spec.burst))

    def wait_seconds(self, amount: float = 1.0) -> float:
        """Seconds until `amount` tokens are available (0 if they are now)."""
        need = self.level() + amount - self.spec.burst
        return max(0.0, need / self.spec.rate)

    # The header numbers, each from a given reading of the level (`level()` when None),
    # so that one verdict's numbers can share a single reading.

    def retry_after(self, amount: float = 1.0, level: float | None = None) -> int:
        """Whole seconds, rounded up, after which `amount` tokens are available."""
        need = (self.level() if level is None else level) + amount - self.spec.burst
        if need <= _EPS:
            return 0
        return max(1, math.ceil((need - _EPS / 2) / self.spec.rate))

    def remaining(self, level: float | None = None) -> int:
        used = self.level() if level is None else level
        return max(0, math.floor(self.spec.burst - used + _EPS))

    def reset(self, level: float | None = None) -> int:
        """Whole seconds until the bucket is full again."""
        used = self.level() if level is None else level
        if used <= _EPS:
            return 0
        return math.ceil((used - _EPS / 2) / self.spec.rate)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one tier for one request, with the numbers for the headers."""

    allowed: bool
    limit: int
    remaining: int
    reset: int
    retry_after: int = 0
    tier: str = "local"
    window: float = 0.0

    def headers(self) -> dict[str, str]:
        out = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset),
        }
        if self.window:
            out["RateLimit-Policy"] = f"{self.limit};w={max(1, math.ceil(self.window))}"
        if not self.allowed:
            out["Retry-After"] = str(max(1, self.retry_after))
        return out


def tightest(verdicts: Sequence[Verdict]) -> Verdict:
    """The verdict to report: a refusal with the longest wait, else the fewest left."""
    if len(verdicts) == 1:
        return verdicts[0]
    refused = [v for v in verdicts if not v.allowed]
    if refused:
        return max(refused, key=lambda v: (v.retry_after, -v.remaining))
    return min(verdicts, key=lambda v: (v.remaining, -v.reset))


class LocalLimiter:
    """Buckets by key in a bounded LRU; `acquire` takes one token from each or none."""

    def __init__(self, max_buckets: int, clock: Clock | None = None) -> None:
        self.clock = clock
        self.buckets: LRUCache[Hashable, Bucket] = LRUCache(maxsize=max(1, max_buckets))

    def bucket(self, key: Hashable, spec: Rate) -> Bucket:
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = Bucket(spec, self.clock)
            self.buckets[key] = bucket
        elif bucket.spec != spec:
            fresh = Bucket(spec, self.clock)
            fresh.carry_level_from(bucket)
            self.buckets[key] = bucket = fresh
        return bucket

    def peek(self, keys: Sequence[tuple[Hashable, Rate]]) -> Verdict | None:
        """The current state of the buckets, consuming nothing (for headers)."""
        if not keys:
            return None
        return tightest([_state(self.bucket(k, s), True) for k, s in keys])

    def try_acquire(self, keys: Sequence[tuple[Hashable, Rate]]) -> Verdict | None:
        """`acquire` without waiting: a token from every bucket now, or from none."""
        if not keys:
            return None
        buckets = [self.bucket(k, s) for k, s in keys]
        short = [b for b in buckets if not b.has_capacity()]
        if short:
            return tightest([_state(b, False) for b in short])
        # Capacity was just checked and nothing here yields: taking is atomic.
        for b in buckets:
            b.take()
        return tightest([_state(b, True) for b in buckets])

    async def acquire(
        self, keys: Sequence[tuple[Hashable, Rate]], max_wait: float = 0.0
    ) -> Verdict | None:
        """Take a token from every bucket, or from none and say how long to wait.

        Never waits longer than `max_wait` seconds; with 0 it answers at once.
        None when there is no bucket to check.
        """
        if max_wait <= 0:
            return self.try_acquire(keys)
        buckets = [self.bucket(k, s) for k, s in keys]
        deadline: float | None = None
        while True:
            short = [b for b in buckets if not b.has_capacity()]
            if not short:
                # Capacity was just checked and nothing here yields, so taking from
                # every bucket is atomic.
                for b in buckets:
                    b.take()
                return tightest([_state(b, True) for b in buckets])
            wait = max(b.wait_seconds() for b in short)
            if max_wait <= 0:
                return tightest([_state(b, False) for b in short])
            now = self._now()
            if deadline is None:
                deadline = now + max_wait
            if now + wait > deadline:
                return tightest([_state(b, False) for b in short])
            await asyncio.sleep(wait)

    def _now(self) -> float:
        return self.clock() if self.clock is not None else asyncio.get_running_loop().time()


def _state(bucket: Bucket, allowed: bool) -> Verdict:
    """The bucket's numbers for the headers, from one reading of its level (the same
    as `remaining()`, `reset()` and `retry_after()` would give one after another)."""
    spec = bucket.spec
    level = bucket.level()
    return Verdict(
        allowed=allowed,
        limit=spec.burst,
        remaining=bucket.remaining(level),
        reset=bucket.reset(level),
        retry_after=0 if allowed else bucket.retry_after(1.0, level),
        tier="local",
        window=spec.burst / spec.rate,
    )

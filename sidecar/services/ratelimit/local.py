"""The local rate-limit tier: token buckets in a bounded LRU, per process.

Owns the token bucket, bucket lookup (a bucket not in the LRU is full; a policy
reload re-sizes a bucket without a free burst), the check-then-take of several buckets
at once, the bounded wait (`rateLimit.maxWait`), and the numbers behind the 429
headers.

A bucket is `burst` tokens refilled at `rate` per second; a request takes one. Its
state is one clock reading, `full_at`: when it will be full again (GCRA's theoretical
arrival time). The tokens in use at `now` are `max(0, full_at - now) * rate`, and
taking `n` tokens moves `full_at` to `now + (in use + n) / rate`.

The LRU maps a string key (the stage's `tenant/bucket`, or a client address) to
`complex(full_at, rate)`: the rate the bucket was made for rides along so that a
reload that changes it converts the tokens in use instead of handing out a free
burst (a smaller burst caps them when next read). A complex number is Python's one
built-in pair of floats that the cyclic garbage collector does not track, and a dict
of strings to such numbers is never tracked at all: the collector never scans the
buckets, so a million tenants add nothing to its pauses (DESIGN §6, §11). An object
per bucket, as aiolimiter's `AsyncLimiter` was, made every full collection scan them
all: pauses of 0.3 to 2.5 s with 100,000 buckets (docs/performance.md,
"many-tenants").

A bucket missing from the LRU is full, and the LRU evicts the least recently used
ones, those most likely to be full already: evicting changes nothing for them. A
bucket is stored when a token is taken (or a reload re-sizes it), never by a mere
look, so refusals and header reads do not grow the LRU. The default clock is
`time.monotonic`; tests inject one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from sidecar.policy.kinds.ratelimits import Rate

Clock = Callable[[], float]
# (bucket key, its rate and burst) for each bucket a request draws from.
Keys = Sequence[tuple[str, Rate]]

# Tolerance, in tokens, for float rounding: a client that waits exactly the
# Retry-After it was given must get through, whatever the clock's float error.
_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class BucketAnswer:
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


def tightest(verdicts: Sequence[BucketAnswer]) -> BucketAnswer:
    """The verdict to report: a refusal with the longest wait, else the fewest left."""
    if len(verdicts) == 1:
        return verdicts[0]
    refused = [v for v in verdicts if not v.allowed]
    if refused:
        return max(refused, key=lambda v: (v.retry_after, -v.remaining))
    return min(verdicts, key=lambda v: (v.remaining, -v.reset))


def verdict(spec: Rate, used: float, allowed: bool) -> BucketAnswer:
    """The header numbers of a bucket of `spec` with `used` tokens in use (after the
    request's own token, when it was allowed)."""
    burst, rate = spec.burst, spec.rate
    # Whole seconds, rounded up, until one more token is free (refusals only) ...
    need = used + 1.0 - burst
    retry = 0 if allowed or need <= _EPS else max(1, math.ceil((need - _EPS / 2) / rate))
    return BucketAnswer(
        allowed=allowed,
        limit=burst,
        remaining=max(0, math.floor(burst - used + _EPS)),
        # ... and until the bucket is full again.
        reset=0 if used <= _EPS else math.ceil((used - _EPS / 2) / rate),
        retry_after=retry,
        tier="local",
        window=burst / rate,
    )


class LocalLimiter:
    """Token buckets by key in a bounded LRU; `acquire` takes one token from each of a
    request's buckets or from none."""

    def __init__(self, max_buckets: int, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or time.monotonic
        # key → complex(full_at, rate) (see the module docstring)
        self.buckets: LRUCache[str, complex] = LRUCache(maxsize=max(1, max_buckets))

    def used(self, key: str, spec: Rate, now: float) -> float:
        """Tokens in use in `key`'s bucket at `now` (0: full). A bucket made for
        another rate keeps its tokens in use, and none beyond the burst: a reload
        never hands out a free burst."""
        state = self.buckets.get(key)  # a hit makes it the most recently used
        if state is None:
            return 0.0
        full_at, rate = state.real, state.imag
        used = (full_at - now) * rate if full_at > now else 0.0
        if used > spec.burst or rate != spec.rate:
            used = min(used, float(spec.burst))
            self._store(key, spec, now, used)
        return used

    def _store(self, key: str, spec: Rate, now: float, used: float) -> None:
        self.buckets[key] = complex(now + used / spec.rate, spec.rate)

    def peek(self, keys: Keys) -> BucketAnswer | None:
        """The current state of the buckets, consuming nothing (for headers)."""
        if not keys:
            return None
        now = self.clock()
        return tightest([verdict(s, self.used(k, s, now), True) for k, s in keys])

    def try_acquire(self, keys: Keys) -> BucketAnswer | None:
        """`acquire` without waiting: a token from every bucket now, or from none."""
        if not keys:
            return None
        return self._attempt(keys, self.clock())[0]

    async def acquire(self, keys: Keys, max_wait: float = 0.0) -> BucketAnswer | None:
        """Take a token from every bucket, or from none and say how long to wait.

        Never waits longer than `max_wait` seconds; with 0 it answers at once.
        None when there is no bucket to check.
        """
        if not keys:
            return None
        deadline: float | None = None
        while True:
            now = self.clock()
            found, wait = self._attempt(keys, now)
            if found.allowed or max_wait <= 0:
                return found
            if deadline is None:
                deadline = now + max_wait
            if now + wait > deadline:
                return found
            await asyncio.sleep(wait)

    def _attempt(self, keys: Keys, now: float) -> tuple[BucketAnswer, float]:
        """Take a token from every bucket at `now`, or from none: the verdict, and
        the seconds until every bucket has a token (0 when taken)."""
        levels = [self.used(k, s, now) for k, s in keys]
        short = [
            (s, u) for (_k, s), u in zip(keys, levels, strict=True) if u + 1.0 > s.burst + _EPS
        ]
        if short:
            wait = max((u + 1.0 - s.burst) / s.rate for s, u in short)
            return tightest([verdict(s, u, False) for s, u in short]), wait
        # Every bucket was just checked and nothing here yields: taking is atomic.
        taken = []
        for (key, spec), u in zip(keys, levels, strict=True):
            self._store(key, spec, now, u + 1.0)
            taken.append(verdict(spec, u + 1.0, True))
        return tightest(taken), 0.0

"""The global rate-limit tier: GCRA in Redis, shared by every sidecar replica.

Owns the Lua script, the key layout and the fail-open policy. Redis is one server, a
Redis Cluster or a Sentinel-watched master (`rateLimit.global`, any URL form of
sidecar/services/redis_client.py). One script call checks every bucket of a request (tenant,
class and user keys, all hash-tagged `{tenant}` so they share a cluster slot, and the
only keys the script touches) against the Redis server's clock (`TIME`), and writes
only when all of them admit it. Each key holds one number: the bucket's theoretical
arrival time (TAT) in microseconds, expiring once the bucket would be full again.

If Redis cannot be reached (or answers an error), as while a master fails over, the
tier fails open: the request is decided by the local tier alone,
`sidecar_ratelimit_global_fail_open_total` counts it, and a warning is logged at most
once per `rateLimit.failOpenLogInterval`. After a failure the tier is skipped for
`RETRY_SECONDS`, so an unreachable Redis costs one timeout per second, not one per
request. A failover loses at most the buckets' last writes: a tenant may get up to
one more burst.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from sidecar.config.settings import RATE_LIMIT_REDIS_PREFIX
from sidecar.core.redact import redact_url
from sidecar.policy.kinds.ratelimits import Rate
from sidecar.services.metrics import Metrics
from sidecar.services.ratelimit.local import BucketAnswer
from sidecar.services.redis_client import ERRORS, RedisHandle, error_text, open_redis, tenant_key

log = logging.getLogger("sidecar.ratelimit")

RETRY_SECONDS = 1.0

# KEYS: bucket keys. ARGV: per key, emission interval (µs) then burst.
# Returns {allowed (0|1), retry_after_us, remaining, reset_us, limit}.
GCRA_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local retry, no_reset, no_limit = -1, 0, 0
local left, ok_reset, ok_limit = -1, 0, 0
local tats = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local new_tat = tat + interval
  local allow_at = new_tat - burst * interval
  if allow_at > now then
    if allow_at - now > retry then
      retry, no_reset, no_limit = allow_at - now, tat - now, burst
    end
  else
    local n = math.floor((now - allow_at) / interval)
    if left < 0 or n < left then
      left, ok_reset, ok_limit = n, new_tat - now, burst
    end
  end
  tats[i] = new_tat
end
if retry >= 0 then
  return {0, math.ceil(retry), 0, math.ceil(no_reset), no_limit}
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, string.format('%.0f', tats[i]), 'PX',
             math.ceil((tats[i] - now) / 1000) + 1)
end
return {1, 0, left, math.ceil(ok_reset), ok_limit}
"""


class GlobalTier:
    """GCRA buckets in Redis, checked after the local tier admitted a request."""

    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        prefix: str = RATE_LIMIT_REDIS_PREFIX,
        timeout: float = 0.25,
        log_interval: float = 30.0,
    ) -> None:
        self.url = url
        self.metrics = metrics
        self.prefix = prefix
        self.log_interval = log_interval
        self.redis: RedisHandle = open_redis(url, timeout=timeout)
        self.script: Any = self.redis.client.register_script(GCRA_LUA)
        self.down_until = 0.0
        self.last_logged = -math.inf
        self.last_error = ""
        self.fail_open_count = 0

    def key(self, tenant: str, suffix: str) -> str:
        return tenant_key(self.prefix, tenant, suffix)

    async def acquire(
        self, tenant: str, buckets: Sequence[tuple[str, Rate]]
    ) -> BucketAnswer | None:
        """Take one token from each of the tenant's buckets, all or none.

        `buckets` are (key suffix, rate). None means "no answer": no bucket, or Redis
        unreachable (fail open, counted and logged).
        """
        if not buckets:
            return None
        if time.monotonic() < self.down_until:
            self._fail_open(None)
            return None
        keys = [self.key(tenant, suffix) for suffix, _ in buckets]
        args: list[int] = []
        for _, spec in buckets:
            args += [max(1, round(1_000_000 / spec.rate)), spec.burst]
        try:
            await self.redis.initialize()
            result = await self.script(keys=keys, args=args)
        except ERRORS as exc:
            self.down_until = time.monotonic() + RETRY_SECONDS
            self._fail_open(exc)
            return None
        if self.last_error:
            log.warning("global rate-limit tier %s reachable again", redact_url(self.url))
            self.last_error = ""
        allowed, retry_us, remaining, reset_us, limit = (int(x) for x in result)
        window = max((s.burst / s.rate for _, s in buckets), default=0.0)
        return BucketAnswer(
            allowed=bool(allowed),
            limit=limit,
            remaining=max(0, remaining),
            reset=_whole_seconds(reset_us),
            retry_after=_whole_seconds(retry_us),
            tier="global",
            window=window,
        )

    def _fail_open(self, exc: BaseException | None) -> None:
        self.metrics.ratelimit_fail_open.inc()
        self.fail_open_count += 1
        if exc is not None:
            self.last_error = error_text(exc)
        now = time.monotonic()
        if now - self.last_logged >= self.log_interval:
            self.last_logged = now
            log.warning(
                "global rate-limit tier %s unreachable (%s); failing open to the local tier "
                "(%d request(s) so far; logged at most every %gs)",
                redact_url(self.url),
                self.last_error or "retrying later",
                self.fail_open_count,
                self.log_interval,
            )

    async def ping(self) -> tuple[bool, str]:
        """(reachable, its state for `/readyz` after the URL that names the topology):
        `reachable`, `3 masters ok`, `master 10.0.0.5:6379 ok`, or `unreachable
        (ConnectionError), failing open to the local tier`."""
        ok, state = await self.redis.state()
        if not ok:
            state += ", failing open to the local tier"
        return ok, state

    async def close(self) -> None:
        await self.redis.close()


def _whole_seconds(microseconds: int) -> int:
    """Microseconds rounded up to whole seconds (Redis's clock has µs resolution)."""
    if microseconds <= 0:
        return 0
    return (microseconds + 999_999) // 1_000_000

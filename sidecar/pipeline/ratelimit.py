"""The rate-limit stages: per-tenant limits right after authentication, and the
per-address limit for unauthenticated requests before identity (DESIGN §1, §6).

`TenantRateLimitStage` runs before isolation, authorization, owner lookups, body reads and
access reviews, so every request of an authenticated caller (allowed, concealed or
refused later) spends from its own tenant's budget, and an over-limit caller costs no
upstream call. It keys every bucket by the CALLER's tenant (from `ctx.identity`),
never the tenant named in the URL, so a request naming another tenant cannot drain
that tenant's bucket. Order inside the stage: a slot (`maxInFlight` for ordinary
requests, `maxWatches` for watches), local buckets, global tier (if configured), then
the rest of the chain; a refusal reads no body and makes no upstream call. In dry-run
mode (global or per tenant) would-be refusals are counted as `would_limit` and the
request goes on.

`AnonymousRateLimitStage` runs first, before the target is even parsed. A request with
no credentials at all is charged to its client address's bucket before any other
work. A request with credentials is never limited by the address (many tenants share
one address behind a load balancer); only when it is refused before its caller is
known (its authentication FAILS, its target is malformed) is the refusal charged to
the address, and once the address's budget is spent such refusals are answered 429.
Both refusals carry the audit note `ANONYMOUS_REFUSAL`: an address's flood of them is
one audit record a second (sidecar/services/audit.py).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from sidecar.config.settings import RATE_LIMIT_REDIS_PREFIX, RateLimitConfig
from sidecar.core.redact import redact_url as redact
from sidecar.core.status import StatusError
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.errors import answer
from sidecar.policy.kinds.ratelimits import Rate, TenantLimits
from sidecar.services.metrics import Metrics
from sidecar.services.ratelimit.inflight import InFlight
from sidecar.services.ratelimit.local import BucketAnswer, Clock, LocalLimiter, tightest
from sidecar.services.ratelimit.tier_redis import GlobalTier

LOCAL, GLOBAL, INFLIGHT, WATCHES, ANONYMOUS = (
    "local",
    "global",
    "inflight",
    "watches",
    "anonymous",
)
ALLOWED, LIMITED, WOULD_LIMIT = "allowed", "limited", "would_limit"
# The audit note of a request refused by the anonymous (per-address) limit: the audit
# records these at most once per address per second, with their count (sidecar/services/audit.py).
ANONYMOUS_REFUSAL = f"{LIMITED}:{ANONYMOUS}"


class RateLimiter:
    """The state both stages share: buckets, in-flight counts and the global tier."""

    def __init__(
        self,
        config: RateLimitConfig,
        metrics: Metrics,
        *,
        clock: Clock | None = None,
        global_tier: GlobalTier | None = None,
    ) -> None:
        rl = config
        self.metrics = metrics
        self.max_wait = rl.max_wait
        self.local = LocalLimiter(rl.max_buckets, clock)
        self.anonymous = LocalLimiter(rl.max_buckets, clock)
        anon = rl.anonymous
        self.anonymous_rate = Rate(anon.rate, max(1, anon.burst)) if anon.rate > 0 else None
        self.inflight = InFlight()
        self.watches = InFlight()
        self.global_tier = global_tier
        if global_tier is None and rl.global_:
            self.global_tier = GlobalTier(
                rl.global_,
                metrics,
                prefix=rl.global_prefix or RATE_LIMIT_REDIS_PREFIX,
                timeout=rl.redis_timeout,
                log_interval=rl.fail_open_log_interval,
            )

    def count(self, tenant: str, tier: str, result: str) -> None:
        metrics = self.metrics
        metrics.child(metrics.ratelimit, metrics.tenant(tenant), tier, result).inc()

    async def close(self) -> None:
        if self.global_tier is not None:
            await self.global_tier.close()

    async def ready(self, policy_describe: str) -> tuple[bool, str]:
        detail = policy_describe
        if self.global_tier is not None:
            _ok, state = await self.global_tier.ping()
            detail += f"; global tier {redact(self.global_tier.url)}: {state}"
        else:
            detail += "; global tier: off (local buckets only)"
        return True, detail


def bucket_specs(limits: TenantLimits, user: str, verb: str) -> list[tuple[str, Rate]]:
    """(key suffix, rate) of every bucket a request of this user and verb draws from."""
    out: list[tuple[str, Rate]] = []
    cls = limits.bucket_for(verb)
    if cls is not None:
        out.append(cls)
    if limits.users is not None:
        out.append(("u:" + user, limits.users))
    return out


def slot_verdict(cap: int) -> BucketAnswer:
    """The headers of a slot refusal for a tenant without a bucket: no slot left."""
    return BucketAnswer(allowed=False, limit=cap, remaining=0, reset=1, retry_after=1, tier="local")


def too_many(message: str, verdict: BucketAnswer | None, retry_after: int) -> StatusError:
    headers = verdict.headers() if verdict is not None else {}
    headers["Retry-After"] = str(max(1, retry_after))
    return StatusError(
        429, message, details={"retryAfterSeconds": max(1, retry_after)}, headers=headers
    )


# A whole answer larger than this is written while the request still holds its slot.
LARGE_ANSWER = 64 * 1024


async def _write_large_answer(ctx: RequestContext, response: web.StreamResponse) -> None:
    """Write a large answer held whole in memory (a created object, a filtered list)
    before the in-flight slot is freed, so a tenant that never reads its answers holds
    at most `maxInFlight` of them, not as many as it can send (found by a hostile
    review: 800 unread answers, 400 MB, no slot held). A client that reads nothing of
    it for `limits.clientWriteTimeout` is cut off by the server's write deadline
    (sidecar/edge/write_deadline.py), which frees the slot. aiohttp writes small answers
    itself, after the handler: they fit in the socket's buffer."""
    if not isinstance(response, web.Response) or response.prepared:
        return
    body = response.body
    if not isinstance(body, bytes | bytearray) or len(body) <= LARGE_ANSWER:
        return
    await response.prepare(ctx.request)
    await response.write_eof()


class TenantRateLimitStage:
    """Per-tenant (and per-user) buckets, the in-flight limit and the watch limit,
    right after authentication."""

    name = "ratelimit"

    def __init__(
        self,
        limiter: RateLimiter,
        already_charged: Callable[[web.Request], bool] | None = None,
    ) -> None:
        self.limiter = limiter
        # A request the decision service already charged (its "already decided"
        # marker, sidecar/edge/authz/marker.py) takes its slot but spends no token here.
        self.already_charged = already_charged

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        identity = ctx.identity
        if identity is None:
            return await call_next(ctx)
        tenant = identity.sender.tenant  # the caller's, never one it impersonates
        verb = ctx.target.verb if ctx.target is not None else ctx.request.method.lower()
        rate_limits = ctx.policy.rate_limits
        limits = rate_limits.for_tenant(tenant)
        watching = verb == "watch"
        if limits is None and not watching:
            return await call_next(ctx)
        lim = self.limiter
        dry = ctx.dry_run
        specs = bucket_specs(limits, identity.user, verb) if limits is not None else []
        # `tenant/bucket`: a tenant name has no "/" (a DNS label), so keys never clash;
        # plain strings keep the bucket store out of the garbage collector's way
        # (sidecar/services/ratelimit/local.py).
        keys = [(f"{tenant}/{suffix}", spec) for suffix, spec in specs]

        # A watch is long-lived by design: it takes a watch slot, never an in-flight one.
        cap: int | None
        if watching:
            slots, cap, tier = lim.watches, rate_limits.max_watches(tenant), WATCHES
        else:
            slots, cap, tier = lim.inflight, limits.max_in_flight if limits else None, INFLIGHT
        what = "open watches" if watching else "requests in flight"
        # No mode relaxes these two caps: they keep a tenant's share of the upstream
        # connections, which other tenants need (DESIGN §5 relaxes only refusals that
        # concern the caller's own tenant; a hostile review starved other tenants with
        # a dry-run tenant's watches).
        if cap is not None and not slots.try_enter(tenant, cap):
            lim.count(tenant, tier, LIMITED)
            ctx.audit["ratelimit"] = f"limited:{tier}"
            return answer(
                ctx,
                too_many(
                    f"too many {what} for tenant {tenant!r} (limit {cap})",
                    lim.local.peek(keys) or slot_verdict(cap),
                    1,
                ),
            )
        try:
            charged = self.already_charged is not None and self.already_charged(ctx.request)
            verdict = None if charged else await self._check(ctx, tenant, specs, keys, dry)
            if isinstance(verdict, StatusError):
                return answer(ctx, verdict)
            if verdict is not None:
                headers = verdict.headers()
                headers.pop("Retry-After", None)
                ctx.response_headers.update(headers)
            response = await call_next(ctx)
            if cap is not None:
                await _write_large_answer(ctx, response)
            return response
        finally:
            if cap is not None:
                slots.leave(tenant)

    async def _check(
        self,
        ctx: RequestContext,
        tenant: str,
        specs: list[tuple[str, Rate]],
        keys: list[tuple[str, Rate]],
        dry: bool,
    ) -> BucketAnswer | StatusError | None:
        """The verdict to report in the headers (None: no bucket applies), or the 429
        to answer."""
        lim = self.limiter
        verdict = (
            lim.local.try_acquire(keys)
            if lim.max_wait <= 0
            else await lim.local.acquire(keys, lim.max_wait)
        )
        if verdict is None:
            return None
        if not verdict.allowed:
            return self._refuse(ctx, tenant, LOCAL, verdict, dry)
        if lim.global_tier is not None:
            shared = await lim.global_tier.acquire(tenant, specs)
            if shared is not None:
                if not shared.allowed:
                    return self._refuse(ctx, tenant, GLOBAL, shared, dry)
                lim.count(tenant, GLOBAL, ALLOWED)
                ctx.audit.setdefault("ratelimit", ALLOWED)
                return tightest([verdict, shared])
        lim.count(tenant, LOCAL, ALLOWED)
        ctx.audit.setdefault("ratelimit", ALLOWED)
        return verdict

    def _refuse(
        self, ctx: RequestContext, tenant: str, tier: str, verdict: BucketAnswer, dry: bool
    ) -> BucketAnswer | StatusError:
        """The refusal to answer, or in dry-run the verdict to go on with."""
        lim = self.limiter
        if dry:
            lim.count(tenant, tier, WOULD_LIMIT)
            ctx.audit["ratelimit"] = f"would_limit:{tier}"
            return verdict
        lim.count(tenant, tier, LIMITED)
        ctx.audit["ratelimit"] = f"limited:{tier}"
        return too_many(
            f"too many requests for tenant {tenant!r}; retry after {verdict.retry_after}s",
            verdict,
            verdict.retry_after,
        )


def has_credentials(request: web.BaseRequest) -> bool:
    """Whether the request carries anything an authenticator could accept."""
    headers = request.headers
    return "Authorization" in headers or "X-Remote-User" in headers


class AnonymousRateLimitStage:
    """Per-client-address limit for requests without (valid) credentials."""

    name = "ratelimit-anonymous"

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        lim = self.limiter
        spec = lim.anonymous_rate
        if spec is None:
            return await call_next(ctx)
        address = ctx.request.remote or "unknown"
        if not has_credentials(ctx.request):
            verdict = await lim.anonymous.acquire([(address, spec)], 0.0)
            # No mode relaxes this limit: a dry-run relaxes refusals inside the
            # caller's own tenant (DESIGN §5), and an anonymous client has none.
            if verdict is not None and not verdict.allowed:
                lim.count("", ANONYMOUS, LIMITED)
                ctx.audit["ratelimit"] = ANONYMOUS_REFUSAL
                raise too_many(
                    f"too many unauthenticated requests from {address}",
                    verdict,
                    verdict.retry_after,
                )
            else:
                lim.count("", ANONYMOUS, ALLOWED)
            return await call_next(ctx)
        try:
            response = await call_next(ctx)
        except StatusError as exc:
            if 400 <= exc.code < 500 and ctx.identity is None:
                await self._charge_failure(ctx, address, spec)
            raise
        if 400 <= response.status < 500 and ctx.identity is None:
            await self._charge_failure(ctx, address, spec)
        return response

    async def _charge_failure(self, ctx: RequestContext, address: str, spec: Rate) -> None:
        """A failed authentication costs its address a token; none left → 429."""
        lim = self.limiter
        verdict = lim.anonymous.try_acquire([(address, spec)])
        if verdict is None or verdict.allowed:
            return
        lim.count("", ANONYMOUS, LIMITED)  # in every mode, as above
        ctx.audit["ratelimit"] = ANONYMOUS_REFUSAL
        raise too_many(
            f"too many failed authentications from {address}",
            verdict,
            verdict.retry_after,
        )


__all__ = [
    "AnonymousRateLimitStage",
    "RateLimiter",
    "TenantRateLimitStage",
]

"""The global tier against the real Redis (127.0.0.1:6379), each test under its own
key prefix: GCRA burst and rate, exact retry, all-or-nothing across keys, hash-tagged
keys, two limiters sharing one limit, and failing open when Redis goes away (through
a TCP forwarder this test owns; the shared Redis server is never stopped). The same
buckets on the session's Redis Cluster and Sentinel set, and failing open when a
cluster or the sentinels cannot be reached."""

from __future__ import annotations

import asyncio
import logging
import textwrap

import pytest
import redis.asyncio as aioredis

from sidecar.config.settings import load_config
from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.core.target import parse_target
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.ratelimit import RateLimiter, TenantRateLimitStage
from sidecar.policy.kinds.ratelimits import Rate, parse_rate_limits
from sidecar.policy.source.files import parse_yaml_documents
from sidecar.services.metrics import Metrics
from sidecar.services.ratelimit.tier_redis import GlobalTier
from tests.rigs.forwarder import Forwarder
from tests.rigs.ledgers import redis_url_for
from tests.rigs.processes import free_port

pytestmark = pytest.mark.redis


def tier(url: str, prefix: str, metrics: Metrics | None = None, **kw: float) -> GlobalTier:
    return GlobalTier(url, metrics or Metrics(), prefix=prefix, **kw)


async def test_gcra_burst_then_refusal_with_retry(redis_url: str, redis_prefix: str) -> None:
    t = tier(redis_url, redis_prefix)
    try:
        spec = Rate(0.5, 3)  # one token every 2 s
        verdicts = [await t.acquire("acme", [("all", spec)]) for _ in range(4)]
        assert all(v is not None for v in verdicts)
        assert [v.allowed for v in verdicts if v] == [True, True, True, False]
        assert [v.remaining for v in verdicts if v][:3] == [2, 1, 0]
        refused = verdicts[3]
        assert refused is not None
        assert refused.tier == "global"
        assert refused.retry_after == 2
        assert refused.headers()["Retry-After"] == "2"
        assert refused.limit == 3
        # Keys are hash-tagged by tenant and expire on their own.
        raw = aioredis.from_url(redis_url)
        keys = [k.decode() async for k in raw.scan_iter(match=f"{redis_prefix}*")]
        assert keys == [f"{redis_prefix}{{acme}}:all"]
        ttl = await raw.pttl(keys[0])
        assert 0 < ttl <= 6_100
        await raw.aclose()
    finally:
        await t.close()


async def test_all_or_nothing_across_keys(redis_url: str, redis_prefix: str) -> None:
    t = tier(redis_url, redis_prefix)
    try:
        # Rates slow enough that no token comes back while the test runs (GCRA uses
        # the Redis server's clock: a loaded machine must not refill the bucket).
        tenant, user = Rate(0.01, 5), Rate(0.1, 1)
        first = await t.acquire("acme", [("all", tenant), ("u:alice", user)])
        assert first is not None
        assert first.allowed
        assert first.limit == 1
        second = await t.acquire("acme", [("all", tenant), ("u:alice", user)])
        assert second is not None
        assert not second.allowed
        assert second.retry_after == 10
        # alice's refusal spent nothing of the tenant bucket: 4 left for bob.
        bob = [
            await t.acquire("acme", [("all", tenant), ("u:bob", Rate(100.0, 100))])
            for _ in range(5)
        ]
        assert [v.allowed for v in bob if v] == [True] * 4 + [False]
    finally:
        await t.close()


async def test_two_limiters_share_one_limit(redis_url: str, redis_prefix: str) -> None:
    a, b = tier(redis_url, redis_prefix), tier(redis_url, redis_prefix)
    try:
        spec = Rate(2.0, 4)
        loop = asyncio.get_running_loop()
        start = loop.time()
        admitted = 0
        while loop.time() - start < 1.0:
            for t in (a, b):
                v = await t.acquire("acme", [("all", spec)])
                assert v is not None
                admitted += v.allowed
            await asyncio.sleep(0.01)  # the behaviour under test: the rate over real time
        elapsed = loop.time() - start
        assert 4 <= admitted <= spec.rate * elapsed + spec.burst + 1
    finally:
        await a.close()
        await b.close()


async def test_unreachable_redis_fails_open_counted_and_logged_once(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = Forwarder(redis_url)
    await proxy.start()
    metrics = Metrics()
    t = tier(proxy.url, redis_prefix, metrics, timeout=0.5, log_interval=3600)
    try:
        spec = Rate(100.0, 100)
        assert (v := await t.acquire("acme", [("all", spec)])) is not None
        assert v.allowed
        await proxy.stop()
        caplog.set_level(logging.WARNING, "sidecar.ratelimit")
        results = [await t.acquire("acme", [("all", spec)]) for _ in range(20)]
        assert results == [None] * 20
        assert metrics.registry.get_sample_value("sidecar_ratelimit_global_fail_open_total") == 20
        warnings = [r for r in caplog.records if "failing open" in r.getMessage()]
        assert len(warnings) == 1
        ok, detail = await t.ping()
        assert not ok
        assert "failing open" in detail
    finally:
        await t.close()


async def test_stage_falls_back_to_local_tier_when_redis_stops(
    redis_url: str, redis_prefix: str
) -> None:
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    proxy = Forwarder(redis_url)
    await proxy.start()
    config = load_config(
        env={},
        overrides={
            "rateLimit.global": proxy.url,
            "rateLimit.globalPrefix": redis_prefix,
            "rateLimit.redisTimeout": 0.5,
        },
    )
    metrics = Metrics()
    now = [100.0]
    limiter = RateLimiter(config.rate_limit, metrics, clock=lambda: now[0])
    assert limiter.global_tier is not None
    stage = TenantRateLimitStage(limiter)
    docs, _ = parse_yaml_documents(
        textwrap.dedent("kind: RateLimit\nspec: {rate: 1, burst: 3}\n"), "rl.yaml"
    )
    rate_limits, _ = parse_rate_limits(docs)

    class Snap:
        tenant_modes: dict[str, str] = {}

    snap = Snap()
    snap.rate_limits = rate_limits  # type: ignore[attr-defined]

    async def upstream(ctx: RequestContext) -> web.StreamResponse:
        return web.Response(text="ok")

    async def call() -> int:
        request = make_mocked_request("GET", "/api/v1/tenants/acme/pods")
        ctx = RequestContext(
            request=request,
            request_id="x",
            policy=snap,  # type: ignore[arg-type]
            max_body_bytes=10,
        )
        ctx.target = parse_target("GET", "/api/v1/tenants/acme/pods")
        ctx.identity = Identity("alice", "acme")
        try:
            return (await stage(ctx, upstream)).status
        except StatusError as exc:
            return exc.code

    try:
        assert [await call() for _ in range(2)] == [200, 200]
        # The global bucket now holds 2 of 3; a second replica's traffic shows there.
        other = tier(redis_url, redis_prefix)
        assert (v := await other.acquire("acme", [("all", Rate(1.0, 3))]))
        assert v.allowed
        await other.close()
        now[0] += 0.001
        refused = await call()  # the local tier has room, the shared one does not
        assert refused == 429
        assert (
            metrics.registry.get_sample_value(
                "sidecar_ratelimit_total", {"tenant": "acme", "tier": "global", "result": "limited"}
            )
            == 1
        )
        await proxy.stop()
        # Redis gone: the local tier alone decides; no errors, still limited locally.
        now[0] += 10
        answers = [await call() for _ in range(5)]
        assert answers == [200, 200, 200, 429, 429]
        assert (
            metrics.registry.get_sample_value("sidecar_ratelimit_global_fail_open_total") or 0
        ) >= 3
    finally:
        await limiter.global_tier.close()


@pytest.mark.parametrize("kind", ["redis-cluster", "redis-sentinel"])
async def test_gcra_on_a_replicated_topology(
    kind: str, request: pytest.FixtureRequest, topology_prefix: str
) -> None:
    """The same buckets on a Redis Cluster (the script's keys, all `{tenant}`, in one
    slot) and on a Sentinel-watched master; readiness names the topology's state."""
    url = redis_url_for(kind, request)
    t = tier(url, topology_prefix)
    try:
        spec = Rate(0.5, 3)
        for tenant in ("acme", "beta", "gamma"):  # on different masters of the cluster
            got = [await t.acquire(tenant, [("all", spec), ("u:alice", spec)]) for _ in range(4)]
            assert [v.allowed for v in got if v] == [True, True, True, False], tenant
            refused = got[3]
            assert refused is not None
            assert refused.retry_after == 2
        ok, state = await t.ping()
        assert ok, state
        if kind == "redis-cluster":
            assert state == "3 masters ok"
        else:
            assert state.startswith("master 127.0.0.1:"), state
        assert t.fail_open_count == 0
    finally:
        await t.close()


@pytest.mark.parametrize("form", ["cluster", "sentinel"])
async def test_an_unreachable_topology_fails_open_counted(form: str) -> None:
    hosts = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    url = f"redis+{form}://{hosts}" + ("/mymaster" if form == "sentinel" else "")
    metrics = Metrics()
    t = tier(url, "p:", metrics, timeout=0.5, log_interval=3600)
    try:
        assert await t.acquire("acme", [("all", Rate(1.0, 1))]) is None
        assert metrics.registry.get_sample_value("sidecar_ratelimit_global_fail_open_total") == 1
        ok, detail = await t.ping()
        assert not ok
        assert detail.endswith("failing open to the local tier"), detail
    finally:
        await t.close()

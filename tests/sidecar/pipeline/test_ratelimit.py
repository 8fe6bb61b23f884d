"""The rate-limit stages over HTTP, in an in-process aiohttp server on 127.0.0.1, with
an injected clock: 429 bodies and headers, reads vs writes, per-user buckets, the
in-flight limit with a slow upstream, dry-run, the caller's tenant as the key, and
the per-address limit for unauthenticated requests."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, make_mocked_request

from sidecar.config.settings import load_config
from sidecar.core.identity import Identity
from sidecar.core.status import StatusError, unauthorized
from sidecar.core.target import parse_target
from sidecar.pipeline.chain import Handler, build_chain
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.ratelimit import (
    AnonymousRateLimitStage,
    RateLimiter,
    TenantRateLimitStage,
)
from sidecar.policy.kinds.modes import mode_for
from sidecar.policy.kinds.ratelimits import DEFAULT_MAX_WATCHES, RateLimitPolicy, parse_rate_limits
from sidecar.policy.source.files import parse_yaml_documents
from sidecar.services.metrics import Metrics
from sidecar.wire.status import response as status_response
from tests.rigs.clock import FakeClock

TOKENS = {
    "alice": Identity("alice", "acme"),
    "bob": Identity("bob", "acme"),
    "carol": Identity("carol", "beta"),
    "mallory": Identity("mallory", "beta"),
}


@dataclass
class Snapshot:
    """The two parts of a PolicyBundle the rate-limit stage reads."""

    rate_limits: RateLimitPolicy
    tenant_modes: Mapping[str, str] = field(default_factory=dict)


def policy(text: str, tenant_modes: Mapping[str, str] | None = None) -> Snapshot:
    docs, problems = parse_yaml_documents(textwrap.dedent(text), "rl.yaml")
    assert not problems
    parsed, problems2 = parse_rate_limits(docs)
    assert not problems2
    return Snapshot(parsed, dict(tenant_modes or {}))


class FakeIdentity:
    """Test double for the identity stage: `Authorization: Bearer <user>`."""

    name = "identity"

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        self.calls += 1
        header = ctx.request.headers.get("Authorization", "")
        if not header:
            raise unauthorized("no credentials")
        who = TOKENS.get(header.removeprefix("Bearer "))
        if who is None:
            raise unauthorized("invalid token")
        ctx.identity = who
        assert ctx.target is not None
        ctx.target = ctx.target.resolve_tenant(who.tenant)
        # As the real identity stage does: the caller's mode, once.
        ctx.mode = mode_for(ctx.mode, ctx.policy.tenant_modes, who.tenant)
        return await call_next(ctx)


class Upstream:
    """The terminal handler: counts calls; `gate` makes it slow."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = 0
        self.gate: asyncio.Event | None = None
        self.fail: StatusError | None = None
        self.changed = asyncio.Condition()

    async def wait_entered(self, n: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.entered >= n)

    async def __call__(self, ctx: RequestContext) -> web.StreamResponse:
        self.calls += 1
        self.entered += 1
        async with self.changed:
            self.changed.notify_all()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return web.Response(text="ok", headers=ctx.response_headers)


class Rig:
    def __init__(self, snapshot: Snapshot, overrides: dict[str, Any] | None = None) -> None:
        self.clock = FakeClock(5000.0)
        self.config = load_config(env={}, overrides=overrides or {})
        self.metrics = Metrics()
        self.limiter = RateLimiter(self.config.rate_limit, self.metrics, clock=self.clock)
        self.snapshot = snapshot
        self.identity = FakeIdentity()
        self.upstream = Upstream()
        self.chain = build_chain(
            [
                AnonymousRateLimitStage(self.limiter),
                self.identity,
                TenantRateLimitStage(self.limiter),
            ],
            self.upstream,
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ctx = RequestContext(
            request=request,
            request_id="t",
            policy=self.snapshot,  # type: ignore[arg-type]
            max_body_bytes=1000,
            mode=self.config.mode,
        )
        try:
            ctx.target = parse_target(
                request.method, request.raw_path.split("?")[0], request.query_string
            )
            return await self.chain(ctx)
        except StatusError as exc:
            response = status_response(exc)
            for name, value in ctx.response_headers.items():
                response.headers.setdefault(name, value)
            return response

    def count(self, tenant: str, tier: str, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "sidecar_ratelimit_total", {"tenant": tenant, "tier": tier, "result": result}
        )
        return value or 0.0


MakeClient = Callable[[Rig], Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture
def make_client(aiohttp_client: Any) -> MakeClient:
    async def make(rig: Rig) -> TestClient[web.Request, web.Application]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", rig.handle)
        client: TestClient[web.Request, web.Application] = await aiohttp_client(app)
        return client

    return make


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {user}"}


PODS = "/api/v1/tenants/acme/namespaces/dev/pods"
BETA_PODS = "/api/v1/tenants/beta/namespaces/dev/pods"


async def test_burst_then_429_with_status_body_and_headers(make_client: MakeClient) -> None:
    rig = Rig(policy('kind: RateLimit\nspec: {tenant: "*", rate: 1, burst: 2}\n'))
    client = await make_client(rig)
    first = await client.get(PODS, headers=auth("alice"))
    assert first.status == 200
    assert first.headers["RateLimit-Limit"] == "2"
    assert first.headers["RateLimit-Remaining"] == "1"
    assert first.headers["RateLimit-Reset"] == "1"
    assert "Retry-After" not in first.headers
    second = await client.get(PODS, headers=auth("alice"))
    assert second.status == 200
    assert second.headers["RateLimit-Remaining"] == "0"
    refused = await client.get(PODS, headers=auth("alice"))
    assert refused.status == 429
    body = await refused.json()
    assert body["kind"] == "Status"
    assert body["code"] == 429
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["retryAfterSeconds"] == 1
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.headers["RateLimit-Limit"] == "2"
    assert rig.upstream.calls == 2
    rig.clock.advance(1)
    assert (await client.get(PODS, headers=auth("alice"))).status == 200
    assert rig.count("acme", "local", "allowed") == 3
    assert rig.count("acme", "local", "limited") == 1


async def test_rejection_reads_no_body_and_makes_no_upstream_call(
    make_client: MakeClient,
) -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 1, burst: 1}\n"))
    client = await make_client(rig)
    assert (await client.post(PODS, headers=auth("alice"), data=b"{}")).status == 200
    # A body over the 1000-byte limit: had the stage read it, the answer would be 413.
    refused = await client.post(PODS, headers=auth("alice"), data=b"x" * 5000)
    assert refused.status == 429
    assert rig.upstream.calls == 1


async def test_reads_and_writes_have_separate_buckets(make_client: MakeClient) -> None:
    rig = Rig(
        policy(
            "kind: RateLimit\nspec: {rate: 100, burst: 100,"
            " reads: {rate: 100, burst: 50}, writes: {rate: 1, burst: 1}}\n"
        )
    )
    client = await make_client(rig)
    created = await client.post(PODS, headers=auth("alice"), json={})
    assert created.status == 200
    assert created.headers["RateLimit-Limit"] == "1"
    assert (await client.post(PODS, headers=auth("alice"), json={})).status == 429
    assert (await client.delete(PODS + "/p1", headers=auth("alice"))).status == 429
    for _ in range(5):
        read = await client.get(PODS, headers=auth("alice"))
        assert read.status == 200
        assert read.headers["RateLimit-Limit"] == "50"
    # Reads do not spend write tokens either.
    rig.clock.advance(1)
    assert (await client.put(PODS + "/p1", headers=auth("alice"), json={})).status == 200


async def test_per_user_buckets_inside_a_tenant(make_client: MakeClient) -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 100, burst: 3, users: {rate: 1, burst: 1}}\n"))
    client = await make_client(rig)
    assert (await client.get(PODS, headers=auth("alice"))).status == 200
    refused = await client.get(PODS, headers=auth("alice"))
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert (await client.get(PODS, headers=auth("bob"))).status == 200
    assert (await client.get(BETA_PODS, headers=auth("carol"))).status == 200
    assert rig.count("acme", "local", "limited") == 1


async def test_url_tenant_cannot_drain_another_tenants_bucket(make_client: MakeClient) -> None:
    rig = Rig(
        policy(
            """\
            kind: RateLimit
            spec: {tenant: "*", rate: 1, burst: 3}
            ---
            kind: RateLimit
            spec: {tenant: acme, rate: 1, burst: 2}
            """
        )
    )
    client = await make_client(rig)
    # mallory (tenant beta) hammers URLs naming acme: every request is charged to beta.
    answers = [(await client.get(PODS, headers=auth("mallory"))).status for _ in range(10)]
    assert answers == [200] * 3 + [429] * 7
    assert rig.count("beta", "local", "limited") == 7
    # acme's bucket is untouched: its full burst of 2 is there.
    assert [(await client.get(PODS, headers=auth("alice"))).status for _ in range(3)] == [
        200,
        200,
        429,
    ]
    assert rig.count("acme", "local", "allowed") == 2


async def test_no_rate_limit_documents_means_unlimited(make_client: MakeClient) -> None:
    rig = Rig(policy("kind: ClusterRole\nmetadata: {name: x}\nrules: []\n"))
    client = await make_client(rig)
    for _ in range(30):
        response = await client.get(PODS, headers=auth("alice"))
        assert response.status == 200
        assert "RateLimit-Limit" not in response.headers
    assert rig.upstream.calls == 30


async def test_inflight_limit_with_a_slow_upstream(make_client: MakeClient) -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000, maxInFlight: 2}\n"))
    client = await make_client(rig)
    rig.upstream.gate = asyncio.Event()
    slow = [asyncio.create_task(client.get(PODS, headers=auth("alice"))) for _ in range(2)]
    await rig.upstream.wait_entered(2)
    refused = await client.get(PODS, headers=auth("bob"))  # same tenant: 429 at once
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert "in flight" in (await refused.json())["message"]
    assert rig.count("acme", "inflight", "limited") == 1
    # Another tenant is not affected; its request waits on the same slow upstream.
    other = asyncio.create_task(client.get(BETA_PODS, headers=auth("carol")))
    await rig.upstream.wait_entered(3)
    assert rig.limiter.inflight.counts == {"acme": 2, "beta": 1}
    rig.upstream.gate.set()
    assert [r.status for r in await asyncio.gather(*slow, other)] == [200, 200, 200]
    assert rig.limiter.inflight.counts == {}
    rig.upstream.gate = None
    assert (await client.get(PODS, headers=auth("alice"))).status == 200


async def test_inflight_released_when_the_chain_raises(make_client: MakeClient) -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000, maxInFlight: 1}\n"))
    client = await make_client(rig)
    rig.upstream.fail = StatusError(502, "upstream refused")
    for _ in range(3):
        assert (await client.get(PODS, headers=auth("alice"))).status == 502
    assert rig.limiter.inflight.counts == {}


async def test_inflight_released_on_cancellation() -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000, maxInFlight: 1}\n"))
    rig.upstream.gate = asyncio.Event()
    request = make_mocked_request("GET", PODS, headers=auth("alice"))
    task = asyncio.create_task(rig.handle(request))
    await rig.upstream.wait_entered(1)
    assert rig.limiter.inflight.counts == {"acme": 1}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rig.limiter.inflight.counts == {}


async def test_watches_do_not_hold_inflight_slots(make_client: MakeClient) -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000, maxInFlight: 1}\n"))
    client = await make_client(rig)
    rig.upstream.gate = asyncio.Event()
    watch = asyncio.create_task(client.get(PODS + "?watch=true", headers=auth("alice")))
    await rig.upstream.wait_entered(1)
    rig.upstream.gate.set()
    rig.upstream.gate = None
    assert (await client.get(PODS, headers=auth("alice"))).status == 200
    assert (await watch).status == 200


async def test_open_watches_are_limited_per_tenant(make_client: MakeClient) -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000, maxWatches: 2}\n"))
    client = await make_client(rig)
    rig.upstream.gate = asyncio.Event()
    watches = [
        asyncio.create_task(client.get(PODS + "?watch=true", headers=auth(u)))
        for u in ("alice", "bob")
    ]
    await rig.upstream.wait_entered(2)
    refused = await client.get(PODS + "?watch=true", headers=auth("alice"))
    assert refused.status == 429
    body = await refused.json()
    assert body["kind"] == "Status"
    assert "open watches" in body["message"]
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["RateLimit-Limit"] == "1000"
    assert rig.count("acme", "watches", "limited") == 1
    # Ordinary requests and other tenants' watches are not held back by acme's.
    other = asyncio.create_task(client.get(BETA_PODS + "?watch=true", headers=auth("carol")))
    await rig.upstream.wait_entered(3)
    assert rig.limiter.watches.counts == {"acme": 2, "beta": 1}
    assert rig.limiter.inflight.counts == {}
    rig.upstream.gate.set()
    assert [r.status for r in await asyncio.gather(*watches, other)] == [200] * 3
    assert rig.limiter.watches.counts == {}


async def test_watch_limit_applies_without_rate_limit_documents(
    make_client: MakeClient,
) -> None:
    rig = Rig(policy("kind: ClusterRole\nmetadata: {name: x}\nrules: []\n"))
    client = await make_client(rig)
    rig.upstream.gate = asyncio.Event()
    watches = [
        asyncio.create_task(client.get(PODS + "?watch=true", headers=auth("alice")))
        for _ in range(DEFAULT_MAX_WATCHES)
    ]
    await rig.upstream.wait_entered(DEFAULT_MAX_WATCHES)
    refused = await client.get(PODS + "?watch=true", headers=auth("bob"))
    assert refused.status == 429
    # No bucket to report: the headers describe the watch limit itself.
    assert refused.headers["RateLimit-Limit"] == str(DEFAULT_MAX_WATCHES)
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.headers["Retry-After"] == "1"
    rig.upstream.gate.set()
    assert {r.status for r in await asyncio.gather(*watches)} == {200}


async def test_dry_run_never_relaxes_the_watch_cap(make_client: MakeClient) -> None:
    """Found by a hostile review: a dry-run tenant's watches beyond `maxWatches` filled
    the shared watch pool. The cap keeps other tenants' share, so no mode relaxes it."""
    rig = Rig(policy("kind: RateLimit\nspec: {maxWatches: 1}\n"), {"mode": "dry-run"})
    client = await make_client(rig)
    rig.upstream.gate = asyncio.Event()
    first = asyncio.create_task(client.get(PODS + "?watch=true", headers=auth("alice")))
    await rig.upstream.wait_entered(1)
    refused = [(await client.get(PODS + "?watch=true", headers=auth("alice"))) for _ in range(2)]
    assert [r.status for r in refused] == [429, 429]
    rig.upstream.gate.set()
    assert (await first).status == 200
    assert rig.count("acme", "watches", "limited") == 2
    assert rig.count("acme", "watches", "would_limit") == 0
    assert rig.limiter.watches.counts == {}


async def test_global_dry_run_counts_and_lets_through(make_client: MakeClient) -> None:
    rig = Rig(
        policy("kind: RateLimit\nspec: {rate: 1, burst: 1, maxInFlight: 1}\n"),
        {"mode": "dry-run"},
    )
    client = await make_client(rig)
    answers = [(await client.get(PODS, headers=auth("alice"))) for _ in range(4)]
    assert [r.status for r in answers] == [200] * 4
    assert "Retry-After" not in answers[-1].headers
    assert answers[-1].headers["RateLimit-Remaining"] == "0"
    assert rig.count("acme", "local", "would_limit") == 3
    assert rig.count("acme", "local", "limited") == 0
    assert rig.upstream.calls == 4


async def test_per_tenant_dry_run(make_client: MakeClient) -> None:
    rig = Rig(
        policy("kind: RateLimit\nspec: {rate: 1, burst: 1}\n", {"acme": "dry-run"}),
    )
    client = await make_client(rig)
    assert [(await client.get(PODS, headers=auth("alice"))).status for _ in range(3)] == [200] * 3
    assert [(await client.get(BETA_PODS, headers=auth("carol"))).status for _ in range(3)] == [
        200,
        429,
        429,
    ]
    assert rig.count("acme", "local", "would_limit") == 2
    assert rig.count("beta", "local", "limited") == 2


async def test_dry_run_never_relaxes_the_inflight_cap(make_client: MakeClient) -> None:
    """`maxInFlight` keeps a tenant's share of the upstream pool: held in dry-run too,
    while its token buckets are relaxed (would_limit)."""
    rig = Rig(
        policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000, maxInFlight: 1}\n"),
        {"mode": "dry-run"},
    )
    client = await make_client(rig)
    rig.upstream.gate = asyncio.Event()
    first = asyncio.create_task(client.get(PODS, headers=auth("alice")))
    await rig.upstream.wait_entered(1)
    assert [(await client.get(PODS, headers=auth("alice"))).status for _ in range(2)] == [429] * 2
    rig.upstream.gate.set()
    assert (await first).status == 200
    assert rig.count("acme", "inflight", "limited") == 2
    assert rig.limiter.inflight.counts == {}


async def test_reload_keeps_bucket_level(make_client: MakeClient) -> None:
    rig = Rig(policy("kind: RateLimit\nspec: {rate: 1, burst: 2}\n"))
    client = await make_client(rig)
    for _ in range(2):
        assert (await client.get(PODS, headers=auth("alice"))).status == 200
    rig.snapshot = policy("kind: RateLimit\nspec: {rate: 1, burst: 4}\n")
    answers = [(await client.get(PODS, headers=auth("alice"))).status for _ in range(3)]
    assert answers == [200, 200, 429]  # 2 of the new 4 were already used


async def test_unauthenticated_requests_are_limited_per_address(
    make_client: MakeClient,
) -> None:
    rig = Rig(
        policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000}\n"),
        {"rateLimit.anonymous.rate": 1, "rateLimit.anonymous.burst": 2},
    )
    client = await make_client(rig)
    assert [(await client.get(PODS)).status for _ in range(2)] == [401, 401]
    calls = rig.identity.calls
    refused = await client.get(PODS)
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert rig.identity.calls == calls  # no authentication work was spent on it
    assert rig.count("_none", "anonymous", "limited") == 1
    # The address's budget is spent, yet callers that authenticate are not limited by it.
    for user in ("alice", "bob", "carol"):
        assert (await client.get(PODS, headers=auth(user))).status == 200
    # Failed authentications from the exhausted address are answered 429, not 401.
    bad = await client.get(PODS, headers=auth("nobody"))
    assert bad.status == 429
    rig.clock.advance(1)
    assert (await client.get(PODS)).status == 401


async def test_failed_authentications_spend_the_address_budget(
    make_client: MakeClient,
) -> None:
    rig = Rig(
        policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000}\n"),
        {"rateLimit.anonymous.rate": 1, "rateLimit.anonymous.burst": 2},
    )
    client = await make_client(rig)
    assert [(await client.get(PODS, headers=auth("x"))).status for _ in range(3)] == [
        401,
        401,
        429,
    ]
    calls = rig.identity.calls
    assert (await client.get(PODS)).status == 429  # no credentials: refused up front
    assert rig.identity.calls == calls
    assert (await client.get(PODS, headers=auth("alice"))).status == 200


async def test_no_mode_relaxes_the_anonymous_limit(make_client: MakeClient) -> None:
    """A dry-run relaxes refusals inside the caller's own tenant (DESIGN §5); an
    unauthenticated client has no tenant, so its limit holds in dry-run too."""
    rig = Rig(
        policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000}\n"),
        {"mode": "dry-run", "rateLimit.anonymous.rate": 1, "rateLimit.anonymous.burst": 2},
    )
    client = await make_client(rig)
    assert [(await client.get(PODS)).status for _ in range(3)] == [401, 401, 429]
    assert [(await client.get(PODS, headers=auth("x"))).status for _ in range(2)] == [429, 429]
    assert rig.count("_none", "anonymous", "limited") == 3
    assert rig.count("_none", "anonymous", "would_limit") == 0


async def test_anonymous_limit_off_with_rate_zero(make_client: MakeClient) -> None:
    rig = Rig(
        policy("kind: RateLimit\nspec: {rate: 1000, burst: 1000}\n"),
        {"rateLimit.anonymous.rate": 0},
    )
    client = await make_client(rig)
    assert [(await client.get(PODS)).status for _ in range(60)] == [401] * 60

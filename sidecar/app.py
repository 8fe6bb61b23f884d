"""Builds the sidecar from its config: the services, the stages, the routes.

Every service is built here and handed to the stages that use it; nothing is looked
up by name. The order of the pipeline's stages is stated here and only here
(`build_app`, the list `stages`), as in DESIGN §1:

    metrics → audit → errors → parse → anonymous rate limit → identity
            → rate limit (caller's tenant) → tenant context → impersonation
            → transcode → authorize
            → quota → forward

Each route runs a prefix of that one list in front of its own terminal:

- `/healthz`, `/readyz`: no stage at all (no credentials, no rate limit, never
  forwarded);
- `/quota/v1/…`: through the tenant rate limit and impersonation, then the quota API
  (which authorizes each call itself);
- `/metrics`: through authorization like any non-resource URL, then answered by the
  sidecar, never forwarded;
- everything else: the whole list, then the proxy.

Every request enters through one function, the front door (`FRONT_DOOR`): the
`Expect` check, the framing guard, then the dispatch by path. `sidecar serve` hands
requests to it straight from aiohttp's server (`sidecar/edge/server.py`); the aiohttp
router, which test clients go through, has one catch-all route to the same dispatch
with the same guard and `Expect` handler, so both paths answer alike.

Lifecycles run through aiohttp's `cleanup_ctx` (started in order, stopped in reverse);
one SIGHUP handler reloads the policy and the credential files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from sidecar.config.settings import Config
from sidecar.edge import discovery
from sidecar.edge.authz.app import AUTHZ_KEY, authz_marker, build_authz
from sidecar.edge.health import Readiness, metrics_handler, probe_handler
from sidecar.edge.ops_metrics import OpsGauges
from sidecar.edge.proxy import Upstream
from sidecar.edge.quota_api import PREFIX as QUOTA_PREFIX
from sidecar.edge.quota_api import QuotaApi, QuotaService, upstream_tenant_check
from sidecar.edge.reviews import ReviewApi
from sidecar.edge.server import CLIENT_WRITE_TIMEOUT, FRONT_DOOR, HANDLER_ARGS, Route
from sidecar.edge.watches import WatchTerms
from sidecar.pipeline.audit import AuditStage
from sidecar.pipeline.authorize import Authorizer, AuthorizeStage, forwarded
from sidecar.pipeline.chain import Handler, Stage, build_chain
from sidecar.pipeline.context import RequestContext, request_id_for
from sidecar.pipeline.errors import ErrorStage
from sidecar.pipeline.identity import IdentityStage
from sidecar.pipeline.impersonation import ImpersonationStage
from sidecar.pipeline.metrics import MetricsStage
from sidecar.pipeline.parse import ParseStage
from sidecar.pipeline.quota import QuotaStage, ledger_ready
from sidecar.pipeline.ratelimit import AnonymousRateLimitStage, RateLimiter, TenantRateLimitStage
from sidecar.pipeline.tenant_context import TenantContextStage
from sidecar.pipeline.tenant_context import enter as enter_tenant_context
from sidecar.pipeline.transcode import TranscodeStage
from sidecar.policy.engine import DecisionCache
from sidecar.policy.owner import OwnerLookup
from sidecar.policy.source.reload import Reloader
from sidecar.policy.source.store import PolicyStore
from sidecar.services.audit import AuditLog
from sidecar.services.codecs.kube_protobuf import offload as protobuf_offload
from sidecar.services.identity.authenticators import build_authenticators
from sidecar.services.identity.credentials import CredentialWatcher
from sidecar.services.metrics import Metrics
from sidecar.services.quota.factory import open_ledger
from sidecar.services.quota.gauges import QuotaGauges
from sidecar.services.quota.reconcile import periodic, upstream_fetch
from sidecar.services.quota.redis import RedisLedger
from sidecar.wire import framing, protocol_errors

log = logging.getLogger("sidecar")

# For the CLI: the `metricsListen` app serves these metrics, and a listener's own
# readiness checks (TLS) are registered here.
METRICS_KEY = web.AppKey("metrics", Metrics)
READINESS_KEY = web.AppKey("readiness", Readiness)
# The operational gauges (sidecar/edge/ops_metrics.py); the CLI adds the TLS pair.
OPS_KEY = web.AppKey("ops_gauges", OpsGauges)


Lifecycle = Callable[[web.Application], AsyncIterator[None]]


def build_app(config: Config) -> web.Application:
    """The sidecar's aiohttp app. Raises PolicyLoadError on a broken policy and
    ConfigError on a credential file that does not load."""
    protocol_errors.install()
    metrics = Metrics(config.metrics.max_tenant_labels)
    policy = PolicyStore([config.policies])
    reloader = Reloader(policy, metrics, config.reload)
    upstream = Upstream(config, metrics)
    audit = AuditLog(config.audit, metrics)
    ledger = open_ledger(
        config.ledger,
        config.quota.reservation_ttl_seconds,
        redis_prefix=config.quota.redis_prefix,
    )
    limiter = RateLimiter(config.rate_limit, metrics)
    identity = IdentityStage(build_authenticators(config.identity), config.mode)
    credentials = CredentialWatcher(identity, config.identity)
    gauges = QuotaGauges(
        ledger, metrics, lambda: policy.current.quotas, config.quota.gauge_interval_seconds
    )
    authorizer = Authorizer(
        DecisionCache(config.cache.decisions, metrics.count_decision_cache),
        OwnerLookup(config.cache.owners, config.cache.owner_ttl_seconds),
        upstream.get_json,
        conceal=config.conceal_other_tenants,
        dry_run=upstream.dry_run,
    )
    impersonation = ImpersonationStage(
        config.mode, authorizer.cache, conceal=config.conceal_other_tenants
    )
    # Open watches follow the policy and their credentials (DESIGN §4, §5): decided
    # again on every swap (their impersonation too), authenticated again on every
    # credential reload.
    upstream.watches.follow(
        WatchTerms(
            impersonation.deciding_impersonation(authorizer.authorize),
            forwarded,
            impersonation.acting_identity(identity.authenticate),
            credentials.expires_at,
            lambda: policy.current,
            config.mode,
        )
    )
    reloader.on_swap.append(upstream.watches.policy_changed)
    credentials.on_reload.append(upstream.watches.credentials_changed)
    quota = QuotaStage(ledger, metrics, gauges, upstream)
    quota_api = QuotaApi(
        QuotaService(ledger, lambda: policy.current.quotas, upstream_tenant_check(upstream)),
        conceal=config.conceal_other_tenants,
        cache=authorizer.cache,
    )

    readiness = Readiness(metrics)
    readiness.add("policy", reloader.ready, required=True)
    readiness.add("upstream", upstream.ping, required=True)
    # A Redis ledger names its topology and its state (cluster masters, sentinel master).
    readiness.add(
        "ledger", ledger.ready if isinstance(ledger, RedisLedger) else lambda: ledger_ready(ledger)
    )
    readiness.add("ratelimit", lambda: limiter.ready(policy.current.rate_limits.describe()))
    # A sink that cannot be written (full disk, read-only file) shows here (DESIGN §9).
    readiness.add("audit", audit.ready)
    if credentials.files:
        readiness.add("credentials", credentials.ready)
    ops = OpsGauges(
        metrics, policy, upstream.watches, readiness, config.quota.gauge_interval_seconds
    )

    # The decision service (DESIGN §13): its "already decided" marker.
    marker = authz_marker(config)
    # The order of DESIGN §1, in one place. The tenant rate limit comes right after
    # authentication: every later refusal (impersonation, concealed, forbidden, owner
    # lookup, access review, an undecodable body) is paid for by the caller's tenant,
    # and an impersonating caller's requests by its own tenant (docs/identity.md).
    stages: list[Stage] = [
        MetricsStage(metrics),
        AuditStage(audit),
        ErrorStage(),
        # Before the parse: an unauthenticated client's malformed targets are paid
        # from its address's budget too (their refusals aggregate in the audit log).
        AnonymousRateLimitStage(limiter),
        ParseStage(config.limits.max_header_bytes),
        identity,
        TenantRateLimitStage(limiter, marker.charged if marker is not None else None),
        # A `/tenants/{t}` server URL (DESIGN §3): the caller belongs to `t` or is an
        # operator and `t` exists; else the missing tenant's 404.
        TenantContextStage(upstream_tenant_check(upstream), conceal=config.conceal_other_tenants),
        impersonation,
        TranscodeStage(),
        # Also answers the access reviews (never forwarded): they are decisions.
        AuthorizeStage(authorizer, metrics, ReviewApi(metrics, config.mode)),
        quota,
    ]

    def chain(through: str | None, terminal: Handler) -> Route:
        """A route handler: `stages` up to and including the one named `through`
        (all of them for None), then `terminal`."""
        names = [s.name for s in stages]
        used = stages if through is None else stages[: names.index(through) + 1]
        return _entry(config, policy, build_chain(used, terminal))

    handler_args: dict[str, Any] = {
        # aiohttp's own limits stay above ours so ours answer with a Status body.
        "max_line_size": max(config.limits.max_header_bytes * 2, 16384),
        "max_field_size": max(config.limits.max_header_bytes * 2, 16384),
        # Bodies are forwarded byte for byte, never decompressed (DESIGN §8).
        "auto_decompress": False,
        # The next request's complete headers must arrive within this time, on a
        # new connection and on a kept-alive one alike (slow clients, §8).
        "keepalive_timeout": config.limits.header_timeout,
    }
    app = web.Application(
        handler_args=handler_args,
        # A middleware, not a wrapper in the route: it also sees requests no route
        # matches (`CONNECT host:port`), so they get a Status body too.
        middlewares=[framing.guard],
    )
    app[METRICS_KEY] = metrics
    app[HANDLER_ARGS] = handler_args
    app[CLIENT_WRITE_TIMEOUT] = config.limits.client_write_timeout
    app[READINESS_KEY] = readiness
    app[OPS_KEY] = ops
    if marker is not None:  # the decision service (DESIGN §13), served by `sidecar serve`
        app[AUTHZ_KEY] = build_authz(
            config, policy, stages, authorizer, identity, credentials, metrics, marker
        )
    probes = probe_handler(readiness)
    quota_route = chain("impersonation", quota_api)
    served_discovery = chain("authorize", discovery.served_document)
    _route_all(
        app,
        exact={
            "/healthz": probes,
            "/readyz": probes,
            "/metrics": chain("authorize", metrics_handler(metrics)),
            QUOTA_PREFIX: quota_route,
            discovery.APIS: chain("authorize", discovery.apis_terminal(upstream.forward)),
            **dict.fromkeys(discovery.PATHS, served_discovery),
        },
        prefixes=[(QUOTA_PREFIX + "/", quota_route)],
        default=chain(None, upstream.forward),
    )

    async def first_policy_revision(_: web.Application) -> AsyncIterator[None]:
        metrics.policy_info.info({"revision": policy.current.revision})
        yield

    async def close_ledger(_: web.Application) -> AsyncIterator[None]:
        yield
        await ledger.close()

    async def close_upstream(_: web.Application) -> AsyncIterator[None]:
        yield
        await upstream.close()
        # The protobuf worker process (started by a large body), off the loop: it may
        # take a moment to stop.
        await asyncio.to_thread(protobuf_offload.stop)

    async def close_watches(_: web.Application) -> None:
        # Runs after the listener stops and before aiohttp waits for handlers: open
        # watches end at once (clients re-watch elsewhere), so they never hold the
        # shutdown for `limits.shutdownGraceSeconds`.
        upstream.close_watches()

    reconcile_every = config.quota.reconcile_interval_seconds
    app.cleanup_ctx.extend(
        [
            lambda _: metrics.flushing(),  # first in, last out: the final flush
            _service(audit.start, audit.stop),
            first_policy_revision,
            close_ledger,
            close_upstream,
            _service(None, limiter.close),
            _service(gauges.start, gauges.stop),
            _service(quota.start, quota.stop),
            _background(
                lambda: periodic(upstream_fetch(upstream), ledger, reconcile_every),
                enabled=reconcile_every > 0,
            ),
            _service(credentials.start, credentials.stop),
            _service(reloader.start, reloader.stop),
            _service(ops.start, ops.stop),
            _on_sighup([lambda: reloader.request(force=True), credentials.request]),
        ]
    )
    app.on_shutdown.append(close_watches)
    return app


def _route_all(
    app: web.Application,
    exact: dict[str, Route],
    prefixes: Sequence[tuple[str, Route]],
    default: Route,
) -> None:
    """One aiohttp route for every path and method, dispatching by the decoded path
    (an exact path, then a prefix, else `default`): aiohttp's router tries its routes
    one by one with regular expressions, which costs more per request than these few
    string comparisons. Every method reaches the handler: the sidecar answers 405
    itself, with a Status body, where a method does not apply."""

    async def dispatch(request: web.Request) -> web.StreamResponse:
        request = enter_tenant_context(request)  # `/tenants/{t}/…`: the rest, in `t`
        path = request.path
        handler = exact.get(path)
        if handler is None:
            handler = default
            for prefix, route in prefixes:
                if path.startswith(prefix):
                    handler = route
                    break
        return await handler(request)

    app.router.add_route("*", "/{tail:.*}", dispatch, expect_handler=framing.expect_handler)

    async def front_door(request: web.Request) -> web.StreamResponse:
        # What aiohttp's Application does for the route above, without its router,
        # middleware chain and per-request bookkeeping.
        if request.headers.get("Expect"):
            answered = await framing.expect_handler(request)
            await request.writer.drain()
            if answered is not None:
                return answered
        return await framing.guard(request, dispatch)

    app[FRONT_DOOR] = front_door


def _entry(config: Config, policy: PolicyStore, handler: Handler) -> Route:
    """The aiohttp handler of a chain: the request's context, with the policy
    snapshot it is decided by from start to end."""
    max_body = config.limits.max_body_bytes
    mode = config.mode

    async def handle(request: web.Request) -> web.StreamResponse:
        ctx = RequestContext(
            request=request,
            request_id=request_id_for(request),
            policy=policy.current,
            max_body_bytes=max_body,
            mode=mode,
        )
        return await handler(ctx)

    return handle


def _service(
    start: Callable[[], Awaitable[None]] | None, stop: Callable[[], Awaitable[None]]
) -> Lifecycle:
    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        if start is not None:
            await start()
        yield
        await stop()

    return lifecycle


def _background(make: Callable[[], Awaitable[None]], *, enabled: bool) -> Lifecycle:
    """A task that runs for the app's lifetime, when enabled."""

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.ensure_future(make()) if enabled else None
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifecycle


def _on_sighup(actions: Sequence[Callable[[], None]]) -> Lifecycle:
    """The process's one SIGHUP handler while the app runs: reload everything that
    reloads (the policy at once, without the debounce; the credential files)."""

    def reload_all() -> None:
        log.info("SIGHUP: reloading the policy and the credential files")
        for action in actions:
            action()

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, reload_all)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            log.info("SIGHUP is not available here; files are still watched")
            yield
            return
        yield
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGHUP)

    return lifecycle


__all__ = ["FRONT_DOOR", "HANDLER_ARGS", "METRICS_KEY", "OPS_KEY", "READINESS_KEY", "build_app"]

"""Builds the sidecar from its config: the services, the pipeline, the aiohttp app.

The order of the pipeline's stages is decided here and only here:

    observe → parse → anonymous rate limit → identity → rate limit (caller's tenant)
            → isolation → authorize → quota → forward

Requests under `/quota/v1/` are answered by the sidecar's quota API after identity
and rate limiting (the API authorizes each call itself). `/healthz` and `/readyz`
bypass the pipeline: no credentials, no rate limit, never forwarded. `/metrics` goes
through the main pipeline like any non-resource URL and is answered by the sidecar,
never forwarded (`sidecar.health`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from sidecar import (
    authorize,
    framing,
    health,
    identity,
    isolation,
    parse_stage,
    protocol_errors,
)
from sidecar.audit import AuditLog
from sidecar.config import Config
from sidecar.context import RequestContext
from sidecar.errors import StatusError
from sidecar.metrics import Metrics
from sidecar.observe import ObserveStage, request_id_for
from sidecar.pipeline import Handler, build_chain
from sidecar.policy.reload import make_reloader
from sidecar.policy.store import PolicyStore
from sidecar.proxy import Upstream
from sidecar.quota import api as quota_api
from sidecar.quota import stage as quota_stage
from sidecar.ratelimit import stage as ratelimit_stage
from sidecar.runtime import Runtime

RUNTIME_KEY = web.AppKey("runtime", Runtime)
QUOTA_PREFIX = "/quota/v1"
LOCAL_PATHS = frozenset({"/healthz", "/readyz"})


def build_runtime(config: Config) -> Runtime:
    """Everything the stages share. Raises PolicyLoadError on a broken policy."""
    metrics = Metrics(config.metrics.max_tenant_labels)
    store = PolicyStore([config.policies])
    upstream = Upstream(config, metrics)
    rt = Runtime(config=config, metrics=metrics, policy=store, upstream=upstream)
    rt.ready_checks["upstream"] = upstream.ping
    return rt


def build_app(config: Config, rt: Runtime | None = None) -> web.Application:
    protocol_errors.install()
    rt = rt or build_runtime(config)
    audit = AuditLog(config.audit, rt.metrics)
    rt.extras["audit"] = audit
    observe = ObserveStage(rt.metrics, audit)
    parse = parse_stage.make_stage(rt)
    anonymous = ratelimit_stage.make_anonymous_stage(rt)
    authenticate = identity.make_stage(rt)
    rate_limit = ratelimit_stage.make_stage(rt)

    main_chain = build_chain(
        [
            observe,
            parse,
            anonymous,
            authenticate,
            # Right after authentication: every later refusal (concealed, forbidden,
            # owner lookup, access review) is paid for by the caller's tenant.
            rate_limit,
            isolation.make_stage(rt),
            authorize.make_stage(rt),
            quota_stage.make_stage(rt),
        ],
        health.metrics_terminal(rt, rt.upstream.forward),
    )
    quota_chain = build_chain(
        [observe, parse, anonymous, authenticate, rate_limit], quota_api.make_api_handler(rt)
    )
    reloader = make_reloader(rt)

    app = web.Application(
        handler_args={
            # aiohttp's own limits stay above ours so ours answer with a Status body.
            "max_line_size": max(config.limits.max_header_bytes * 2, 16384),
            "max_field_size": max(config.limits.max_header_bytes * 2, 16384),
            # Bodies are forwarded byte for byte, never decompressed (DESIGN §8).
            "auto_decompress": False,
            # The next request's complete headers must arrive within this time, on a
            # new connection and on a kept-alive one alike (slow clients, §8).
            "keepalive_timeout": config.limits.header_timeout,
        },
        middlewares=[framing.guard],
    )
    app[RUNTIME_KEY] = rt
    app.router.add_route(
        "*",
        "/{tail:.*}",
        _dispatcher(rt, main_chain, quota_chain),
        expect_handler=framing.expect_handler,
    )

    async def startup(_: web.Application) -> None:
        await audit.start()
        for hook in rt.on_startup:
            await hook()
        rt.metrics.policy_info.info({"revision": rt.policy.current.revision})
        await reloader.start()

    async def cleanup(_: web.Application) -> None:
        await reloader.stop()
        for hook in reversed(rt.on_cleanup):
            await hook()
        await rt.upstream.close()
        await audit.stop()

    async def shutdown(_: web.Application) -> None:
        # Runs after the listener stops and before aiohttp waits for handlers:
        # open watches end at once (clients re-watch elsewhere), so they never hold
        # the shutdown for `limits.shutdownGraceSeconds`.
        rt.upstream.close_watches()

    app.on_startup.append(startup)
    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(cleanup)
    return app


def _dispatcher(
    rt: Runtime, main_chain: Handler, quota_chain: Handler
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    max_body = rt.config.limits.max_body_bytes
    policy = rt.policy
    readiness = health.Readiness(rt)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in LOCAL_PATHS:
            return await _local(readiness, path, request.method)
        ctx = RequestContext(
            request=request,
            request_id=request_id_for(request),
            policy=policy.current,
            max_body_bytes=max_body,
        )
        if path == QUOTA_PREFIX or path.startswith(QUOTA_PREFIX + "/"):
            return await quota_chain(ctx)
        return await main_chain(ctx)

    return dispatch


async def _local(readiness: health.Readiness, path: str, method: str) -> web.StreamResponse:
    """`/healthz` and `/readyz`: answered here for every method, never forwarded."""
    if method not in ("GET", "HEAD"):
        return StatusError(
            405, f"{path} answers GET only", headers={"Allow": "GET, HEAD"}
        ).response()
    if path == "/healthz":
        return health.healthz()
    return await readiness.response()

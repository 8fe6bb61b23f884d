"""The sidecar's own endpoints: `/healthz`, `/readyz` and `/metrics` (DESIGN §9).

`/healthz` and `/readyz` need no credentials, never pass the rate limiter and are
never forwarded. `/readyz` is 503 only when the sidecar cannot serve at all (a
`REQUIRED` check fails: no policy, upstream unreachable); any other failing check (the
quota ledger, the global rate-limit tier, a credential file) shows in the details and
keeps it 200. Details never carry a password or a file path (`public_detail`), and the
checks run at most once per `READY_CACHE_SECONDS` however often anonymous clients ask,
so probing `/readyz` cannot load the upstream, Redis or the ledger.

`/metrics` names tenants: on the main listener it goes through the whole pipeline like
any non-resource URL and `metrics_terminal` answers it instead of the upstream; the
optional `metricsListen` address serves it without credentials (`build_metrics_app`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from sidecar.context import RequestContext
from sidecar.errors import StatusError, forbidden
from sidecar.pipeline import Handler
from sidecar.redact import public_detail
from sidecar.runtime import Runtime

log = logging.getLogger("sidecar")

METRICS_PATH = "/metrics"
# Without these the sidecar cannot serve any request.
REQUIRED = frozenset({"policy", "upstream"})
READY_CACHE_SECONDS = 0.5


def healthz() -> web.Response:
    return web.json_response({"status": "ok"})


class Readiness:
    """Runs the runtime's ready checks, single-flight, reusing a fresh result."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._result: tuple[float, int, bytes] | None = None
        self._running: asyncio.Task[tuple[int, bytes]] | None = None

    async def response(self) -> web.Response:
        status, body = await self._get()
        return web.Response(status=status, body=body, content_type="application/json")

    async def _get(self) -> tuple[int, bytes]:
        cached = self._result
        if cached is not None and time.monotonic() - cached[0] < READY_CACHE_SECONDS:
            return cached[1], cached[2]
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._evaluate())
        # shield: one client going away does not cancel the probe the others await.
        return await asyncio.shield(self._running)

    async def _evaluate(self) -> tuple[int, bytes]:
        rt = self.rt
        results: dict[str, tuple[bool, str]] = {
            "policy": (True, f"revision {rt.policy.current.revision}")
        }
        for name, check in list(rt.ready_checks.items()):
            try:
                results[name] = await check()
            except Exception:  # a readiness probe must answer, whatever broke
                log.exception("readiness check %s failed", name)
                results[name] = (False, "the check failed (see the log)")
        checks = {
            name: {"ok": ok, "required": name in REQUIRED, "detail": public_detail(detail)}
            for name, (ok, detail) in results.items()
        }
        for name, (ok, _) in results.items():
            rt.metrics.ready_check.labels(name).set(1 if ok else 0)
        ready = all(ok for name, (ok, _) in results.items() if name in REQUIRED)
        degraded = sorted(name for name, (ok, _) in results.items() if not ok)
        body = json.dumps({"ready": ready, "degraded": degraded, "checks": checks}).encode()
        status = 200 if ready else 503
        self._result = (time.monotonic(), status, body)
        return status, body


def metrics_response(rt: Runtime, method: str) -> web.Response:
    if method not in ("GET", "HEAD"):
        raise StatusError(405, f"{METRICS_PATH} answers GET only", headers={"Allow": "GET, HEAD"})
    return web.Response(body=rt.metrics.render(), content_type="text/plain", charset="utf-8")


def is_metrics(ctx: RequestContext) -> bool:
    target = ctx.target
    return target is not None and not target.resource_request and target.path == METRICS_PATH


def metrics_terminal(rt: Runtime, forward: Handler) -> Handler:
    """The main chain's terminal: `/metrics` is answered here, after identity, rate
    limit and authorization decided it like any non-resource URL; everything else is
    forwarded. `/metrics` never reaches the upstream, whatever the method."""

    async def terminal(ctx: RequestContext) -> web.StreamResponse:
        if is_metrics(ctx):
            # Dry-run lets a would-deny through to the upstream; never to the metrics,
            # which name every tenant (the same reason isolation is never dry-run).
            if ctx.decision is None or not ctx.decision.allowed:
                raise forbidden(
                    f"{METRICS_PATH} needs a grant of nonResourceURLs "
                    f"[{METRICS_PATH}], verb get (dry-run does not apply)"
                )
            return metrics_response(rt, ctx.request.method)
        return await forward(ctx)

    return terminal


def build_metrics_app(rt: Runtime) -> web.Application:
    """The `metricsListen` listener: `/metrics` without credentials, nothing else."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            if request.path != METRICS_PATH:
                raise StatusError(404, f"this listener serves {METRICS_PATH} only")
            return metrics_response(rt, request.method)
        except StatusError as exc:
            return exc.response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app

"""The sidecar's own endpoints: `/healthz`, `/readyz` and `/metrics` (DESIGN §9).

`/healthz` and `/readyz` need no credentials, never pass the rate limiter and are
never forwarded. `/readyz` runs the checks registered with `Readiness.add` (in
`app.py`, explicitly): it is 503 only when a `required` check fails (no policy,
upstream unreachable); any other failing check (the quota ledger, the global
rate-limit tier, a credential file) shows in the details and keeps it 200. Details
never carry a password or a file path (`public_detail`), and the checks run at most
once per `READY_CACHE_SECONDS` however often anonymous clients ask, so probing
`/readyz` cannot load the upstream, Redis or the ledger.

`/metrics` names tenants: on the main listener its route goes through the pipeline
like any non-resource URL and `metrics_handler` answers it once authorization has
allowed it; the optional `metricsListen` address serves it without credentials
(`build_metrics_app`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from sidecar.core.redact import public_detail
from sidecar.core.status import StatusError, forbidden
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.services.metrics import Metrics
from sidecar.wire.status import response as status_response

log = logging.getLogger("sidecar")

METRICS_PATH = "/metrics"
READY_CACHE_SECONDS = 0.5

# A readiness probe: (ok, detail). The detail is shown on /readyz after redaction.
Probe = Callable[[], Awaitable[tuple[bool, str]]]


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    name: str
    probe: Probe
    # Without it the sidecar cannot serve any request: a failure makes /readyz 503.
    required: bool


class Readiness:
    """The registered checks, run single-flight, reusing a fresh result."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.checks: list[ReadyCheck] = []
        self._result: tuple[float, int, bytes] | None = None
        self._running: asyncio.Task[tuple[int, bytes]] | None = None

    def add(self, name: str, probe: Probe, *, required: bool = False) -> None:
        if any(c.name == name for c in self.checks):
            raise ValueError(f"readiness check {name!r} registered twice")
        self.checks.append(ReadyCheck(name, probe, required))

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
        results: dict[str, tuple[bool, str]] = {}
        for check in self.checks:
            try:
                results[check.name] = await check.probe()
            except Exception:  # a readiness probe must answer, whatever broke
                log.exception("readiness check %s failed", check.name)
                results[check.name] = (False, "the check failed (see the log)")
        required = {c.name for c in self.checks if c.required}
        checks = {
            name: {"ok": ok, "required": name in required, "detail": public_detail(detail)}
            for name, (ok, detail) in results.items()
        }
        for name, (ok, _) in results.items():
            self.metrics.ready_check.labels(name).set(1 if ok else 0)
        ready = all(ok for name, (ok, _) in results.items() if name in required)
        degraded = sorted(name for name, (ok, _) in results.items() if not ok)
        body = json.dumps({"ready": ready, "degraded": degraded, "checks": checks}).encode()
        status = 200 if ready else 503
        self._result = (time.monotonic(), status, body)
        return status, body


def _get_only(method: str, path: str) -> None:
    if method not in ("GET", "HEAD"):
        raise StatusError(405, f"{path} answers GET only", headers={"Allow": "GET, HEAD"})


def probe_handler(readiness: Readiness) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`/healthz` and `/readyz`: answered for every method, never forwarded."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            _get_only(request.method, request.path)
        except StatusError as exc:
            return status_response(exc)
        if request.path == "/healthz":
            return web.json_response({"status": "ok"})
        return await readiness.response()

    return handle


def metrics_response(metrics: Metrics, method: str) -> web.Response:
    _get_only(method, METRICS_PATH)
    return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")


def metrics_handler(metrics: Metrics) -> Handler:
    """The terminal of the `/metrics` route: answered only when authorization allowed
    it like any non-resource URL; never forwarded, whatever the method."""

    async def terminal(ctx: RequestContext) -> web.StreamResponse:
        # Dry-run lets a would-deny through to the upstream; never to the metrics,
        # which name every tenant (the same reason isolation is never dry-run).
        if ctx.decision is None or not ctx.decision.allowed:
            raise forbidden(
                f"{METRICS_PATH} needs a grant of nonResourceURLs "
                f"[{METRICS_PATH}], verb get (dry-run does not apply)"
            )
        return metrics_response(metrics, ctx.request.method)

    return terminal


def build_metrics_app(metrics: Metrics) -> web.Application:
    """The `metricsListen` listener: `/metrics` without credentials, nothing else."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            if request.path != METRICS_PATH:
                raise StatusError(404, f"this listener serves {METRICS_PATH} only")
            return metrics_response(metrics, request.method)
        except StatusError as exc:
            return status_response(exc)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app

"""The metrics stage: requests in flight, and each request counted once with its
latency (the registry is `sidecar.services.metrics.Metrics`)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import CLIENT_CLOSED, RequestContext
from sidecar.services.metrics import Metrics


class MetricsStage:
    """Requests in flight, and each request counted once (by caller tenant, verb,
    decision and final status) with its latency, whoever answered it."""

    name = "metrics"

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        metrics = self.metrics
        metrics.in_flight_now += 1
        try:
            response = await call_next(ctx)
            self._count(ctx, response.status)
        except asyncio.CancelledError:
            self._count(ctx, CLIENT_CLOSED)
            raise
        finally:
            metrics.in_flight_now -= 1
            # With several workers, a worker with nothing left in flight hands its
            # counts over at once (before this answer is written), so a scrape made
            # after the answers arrived counts them on whichever worker it lands.
            if metrics.flush_when_idle and not metrics.in_flight_now:
                metrics.flush()
        return response

    def _count(self, ctx: RequestContext, status: int) -> None:
        metrics = self.metrics
        identity, target, decision = ctx.identity, ctx.target, ctx.decision
        tenant = metrics.tenant(identity.tenant if identity else None)
        verb = target.verb if target else ctx.request.method.lower()
        outcome = decision.outcome if decision else "none"
        metrics.child(metrics.requests, tenant, verb, outcome, str(status)).inc()
        metrics.child(metrics.latency, tenant).observe(time.perf_counter() - ctx.started)

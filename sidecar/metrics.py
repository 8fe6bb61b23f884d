"""Prometheus metrics, one registry per app, with a bounded tenant label, and the
metrics stage that counts every request.

Every metric the sidecar exports is declared here, so `/metrics` reads as one list.
Tenant labels go through `Metrics.tenant()`: the first `max_tenant_labels` distinct
tenants keep their name, every later one is `_other`, so made-up tenants cannot
create unbounded series.

With `--workers N` the parent process calls `enable_multiprocess` before forking:
every worker then keeps its values in prometheus-client's multiprocess files in one
per-run directory, and `/metrics` (on either listener, whichever worker answers) sums
them across all workers. Gauges say how their per-process values combine
(`multiprocess_mode`); the policy revision (`Info`) is the answering worker's own.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
    multiprocess,
    values,
)

from sidecar.context import CLIENT_CLOSED, RequestContext
from sidecar.pipeline import Handler

MAX_CACHED_CHILDREN = 50000
OTHER_TENANT = "_other"
NO_TENANT = "_none"
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def enable_multiprocess(directory: str) -> None:
    """Make metrics created from now on (in this process and the ones it forks) keep
    their values in `directory`, for `/metrics` to sum across processes."""
    os.environ[MULTIPROC_DIR_ENV] = directory
    # prometheus-client picks the value class when first imported; re-pick it, in
    # case it was imported before the directory was set.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def process_exited(pid: int) -> None:
    """A worker exited: its `live*` gauges stop counting (its counters stay)."""
    directory = os.environ.get(MULTIPROC_DIR_ENV)
    if directory:
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


class Metrics:
    def __init__(self, max_tenant_labels: int = 500) -> None:
        self.registry = CollectorRegistry()
        self.max_tenant_labels = max_tenant_labels
        self._tenants: set[str] = set()
        # prometheus-client's labels() takes a lock and builds a tuple per call; the
        # hot path asks `child()` instead, which caches the labelled children.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "sidecar_requests_total",
            "Requests answered, by caller tenant, verb, decision and status code.",
            ["tenant", "verb", "decision", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "sidecar_request_duration_seconds",
            "Time from request start to response end, by caller tenant.",
            ["tenant"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=r,
        )
        self.in_flight = Gauge(
            "sidecar_requests_in_flight",
            "Requests being handled now.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.upstream_errors = Counter(
            "sidecar_upstream_errors_total",
            "Upstream failures by kind (refused, timeout, reset).",
            ["kind"],
            registry=r,
        )
        # Authorization
        self.decisions = Counter(
            "sidecar_decisions_total",
            "Authorization decisions by caller tenant and outcome (incl. would_deny).",
            ["tenant", "outcome"],
            registry=r,
        )
        self.decision_cache = Counter(
            "sidecar_decision_cache_total", "Decision cache lookups.", ["result"], registry=r
        )
        self.policy_reloads = Counter(
            "sidecar_policy_reload_total", "Policy reloads by result.", ["result"], registry=r
        )
        self.policy_info = Info("sidecar_policy", "The policy revision in force.", registry=r)
        self.policy_rules = Gauge(
            "sidecar_policy_lines",
            "Compiled Casbin policy lines in force.",
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        # Rate limits
        self.ratelimit = Counter(
            "sidecar_ratelimit_total",
            "Rate-limit outcomes by caller tenant, tier (local/global/inflight/anonymous) "
            "and result (allowed/limited/would_limit).",
            ["tenant", "tier", "result"],
            registry=r,
        )
        self.ratelimit_fail_open = Counter(
            "sidecar_ratelimit_global_fail_open_total",
            "Requests decided by the local tier because the global tier was unreachable.",
            registry=r,
        )
        # Quotas
        self.quota_refusals = Counter(
            "sidecar_quota_refusals_total",
            "Creates refused for quota, by caller tenant and resource.",
            ["tenant", "resource"],
            registry=r,
        )
        self.quota_used = Gauge(
            "sidecar_quota_used",
            "Quota used, by tenant and resource.",
            ["tenant", "resource"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.quota_in_progress = Gauge(
            "sidecar_quota_in_progress",
            "Quota reserved by creates in flight, by tenant and resource.",
            ["tenant", "resource"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.quota_hard = Gauge(
            "sidecar_quota_hard",
            "Quota hard limit, by tenant and resource.",
            ["tenant", "resource"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.ledger_errors = Counter(
            "sidecar_ledger_errors_total", "Ledger operations that failed.", ["op"], registry=r
        )
        # Readiness: each check of the last /readyz evaluation (1 ok, 0 failing), so an
        # outage that keeps /readyz at 200 (ledger, global tier) still shows here.
        self.ready_check = Gauge(
            "sidecar_ready_check",
            "Result of each /readyz check (1 ok, 0 failing).",
            ["check"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        # Audit
        self.audit_dropped = Counter(
            "sidecar_audit_dropped_total",
            "Audit lines dropped because the sink was slower than the traffic.",
            registry=r,
        )
        self._scraped = self._scrape_registry()

    def _scrape_registry(self) -> CollectorRegistry:
        """What `/metrics` shows: this process's registry, or with several worker
        processes the sum of all of theirs (plus this worker's policy revision)."""
        directory = os.environ.get(MULTIPROC_DIR_ENV)
        if not directory:
            return self.registry
        scraped = CollectorRegistry()
        multiprocess.MultiProcessCollector(scraped, path=directory)  # type: ignore[no-untyped-call]
        scraped.register(self.policy_info)
        return scraped

    def tenant(self, tenant: str | None) -> str:
        """The label value for a tenant: itself while under the cap, else `_other`."""
        if not tenant:
            return NO_TENANT
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < self.max_tenant_labels:
            self._tenants.add(tenant)
            return tenant
        return OTHER_TENANT

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached. Label values must already be bounded
        (tenants through `tenant()`)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= MAX_CACHED_CHILDREN:
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return found

    def render(self) -> bytes:
        return generate_latest(self._scraped)


class MetricsStage:
    """Requests in flight, and each request counted once (by caller tenant, verb,
    decision and final status) with its latency, whoever answered it."""

    name = "metrics"

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        metrics = self.metrics
        metrics.in_flight.inc()
        try:
            response = await call_next(ctx)
        except asyncio.CancelledError:
            self._count(ctx, CLIENT_CLOSED)
            raise
        finally:
            metrics.in_flight.dec()
        self._count(ctx, response.status)
        return response

    def _count(self, ctx: RequestContext, status: int) -> None:
        metrics = self.metrics
        identity, target, decision = ctx.identity, ctx.target, ctx.decision
        tenant = metrics.tenant(identity.tenant if identity else None)
        verb = target.verb if target else ctx.request.method.lower()
        outcome = decision.outcome if decision else "none"
        metrics.child(metrics.requests, tenant, verb, outcome, str(status)).inc()
        metrics.child(metrics.latency, tenant).observe(time.perf_counter() - ctx.started)

"""Prometheus metrics, one registry per app, with a bounded tenant label.

Every metric the sidecar exports is declared here, so `/metrics` reads as one list.
Tenant labels go through `Metrics.tenant()`: the first `max_tenant_labels` distinct
tenants keep their name, every later one is `_other`, so made-up tenants cannot
create unbounded series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

MAX_CACHED_CHILDREN = 50000
OTHER_TENANT = "_other"
NO_TENANT = "_none"


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
            "sidecar_requests_in_flight", "Requests being handled now.", registry=r
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
            "sidecar_policy_lines", "Compiled Casbin policy lines in force.", registry=r
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
        )
        self.quota_in_progress = Gauge(
            "sidecar_quota_in_progress",
            "Quota reserved by creates in flight, by tenant and resource.",
            ["tenant", "resource"],
            registry=r,
        )
        self.quota_hard = Gauge(
            "sidecar_quota_hard",
            "Quota hard limit, by tenant and resource.",
            ["tenant", "resource"],
            registry=r,
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
        )
        # Audit
        self.audit_dropped = Counter(
            "sidecar_audit_dropped_total",
            "Audit lines dropped because the sink was slower than the traffic.",
            registry=r,
        )

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
        return generate_latest(self.registry)

"""Prometheus metrics, one registry per app, with a bounded tenant label, and the
metrics stage that counts every request.

Every metric the sidecar exports is declared here, so `/metrics` reads as one list.
Tenant labels go through `Metrics.tenant()`: the first `max_tenant_labels` distinct
tenants keep their name, every later one is `_other`, so made-up tenants cannot
create unbounded series.

The per-request series (requests, latency, decisions, cache lookups, rate-limit
outcomes, requests in flight) are not written to prometheus-client on every request:
`child()` hands out tallies that add up in plain numbers, and `flush()` moves them
into the prometheus metrics. A flush runs before every scrape (a collector registered
first in the registry), every `FLUSH_SECONDS` in the background and at shutdown, so a
scrape of this process is always exact; with several workers, also whenever a worker's
last request in flight ends, so another worker's values lag only while it is busy,
and by at most `FLUSH_SECONDS`. (prometheus-client takes a lock per increment, and
with several workers writes every value to a memory-mapped file: about a tenth of a
cached read's CPU for the six series each request touches.)

With `--workers N` the parent process calls `enable_multiprocess` before forking:
every worker then keeps its values in prometheus-client's multiprocess files in one
per-run directory, and `/metrics` (on either listener, whichever worker answers) sums
them across all workers. Gauges say how their per-process values combine
(`multiprocess_mode`); the policy revision (`Info`) is the answering worker's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    multiprocess,
    values,
)

MAX_CACHED_CHILDREN = 50000
OTHER_TENANT = "_other"
NO_TENANT = "_none"
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
FLUSH_SECONDS = 1.0


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


class _Tally:
    """A labelled counter's increments since the last flush, as a plain number."""

    __slots__ = ("child", "dirty", "pending")

    def __init__(self, child: Any, dirty: list[Any]) -> None:
        self.child = child
        self.dirty = dirty
        self.pending = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if not self.pending:
            self.dirty.append(self)
        self.pending += amount

    def flush(self) -> None:
        if self.pending:
            self.child.inc(self.pending)
            self.pending = 0.0


class _Spread:
    """A labelled histogram's observations since the last flush, bucketed here.

    Flushed into prometheus-client's per-bucket values (`_buckets`, `_sum`: private,
    checked by tests/system/test_dependency_contracts.py); one `observe` per request
    costs a lock and a loop over the buckets."""

    __slots__ = ("bounds", "child", "counts", "dirty", "observed", "total")

    def __init__(self, child: Any, dirty: list[Any]) -> None:
        self.child = child
        self.dirty = dirty
        self.bounds: list[float] = list(child._upper_bounds)
        self.counts = [0] * len(self.bounds)
        self.observed = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        if not self.observed:
            self.dirty.append(self)
        self.observed += 1
        # prometheus buckets are `le`: the first bound >= value (the last is +Inf).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def flush(self) -> None:
        if not self.observed:
            return
        counts = self.counts
        buckets = self.child._buckets
        for i, n in enumerate(counts):
            if n:
                buckets[i].inc(n)
                counts[i] = 0
        self.child._sum.inc(self.total)
        self.total = 0.0
        self.observed = 0


class _FlushFirst:
    """Registered first in a registry: every collection starts with a flush."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        self.metrics.flush()
        self.metrics.refresh()
        return []


def _runtime_collectors(registry: CollectorRegistry) -> None:
    """process_* (CPU, memory, open fds, start time), python_info, python_gc_*."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


class Metrics:
    def __init__(self, max_tenant_labels: int = 500) -> None:
        self.registry = CollectorRegistry()
        # Tallies with something to flush, and the requests in flight (a plain count,
        # set on the gauge at each flush).
        self._dirty: list[Any] = []
        self.in_flight_now = 0
        self._in_flight_shown = 0
        # Several worker processes (`enable_multiprocess`): flush when idle too.
        self.flush_when_idle = bool(os.environ.get(MULTIPROC_DIR_ENV))
        self.registry.register(_FlushFirst(self))
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
        # Defence in depth (issue 28): a commit that would book more than was reserved
        # books the reservation and reconciles the tenant; it should never happen.
        self.quota_overcommit = Counter(
            "sidecar_quota_overcommit_total",
            "Commits refused because the stored object is charged more than was reserved "
            "(booked as reserved; the tenant is reconciled at once), by tenant and resource.",
            ["tenant", "resource"],
            registry=r,
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
        # Operations (sidecar/edge/ops_metrics.py sets them; deploy/monitoring uses
        # them): refreshed before every scrape and every FLUSH_SECONDS by `refreshers`.
        self.refreshers: list[Callable[[], None]] = []
        self.watches_open = Gauge(
            "sidecar_watches_open",
            "Watches open now, by caller tenant.",
            ["tenant"],
            registry=r,
            multiprocess_mode="livesum",
        )
        # The certificate's gauges exist only once the listener serves TLS
        # (`serving_tls()`): a 0 would read as "expired" to an alert.
        self.tls_expiry: Gauge | None = None
        self.tls_reload_ok: Gauge | None = None
        self.policy_source_ok = Gauge(
            "sidecar_policy_source_ok",
            "0 while the last change of the policy files was refused (the last good policy "
            "stays in force), else 1.",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.policy_loaded = Gauge(
            "sidecar_policy_loaded_timestamp_seconds",
            "When the policy revision in force was loaded (Unix time).",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.ledger_up = Gauge(
            "sidecar_ledger_up",
            "1 when the quota ledger answered its last check (a heartbeat write), else 0.",
            registry=r,
            multiprocess_mode="livemin",
        )
        # Series that exist from the start at 0, so rate() and increase() see their
        # first event and dashboards show 0, not "no data".
        for kind in ("refused", "timeout", "reset"):
            self.upstream_errors.labels(kind)
        for result in ("success", "unchanged", "failure"):
            self.policy_reloads.labels(result)
        for result in ("hit", "miss"):
            self.decision_cache.labels(result)
        for op in ("reserve", "commit", "commit_change", "release", "mark_unsettled", "delete"):
            self.ledger_errors.labels(op)
        # Process and runtime: CPU, memory, open fds, start time (process_*), the Python
        # version (python_info) and the garbage collector (python_gc_*).
        _runtime_collectors(r)
        self._scraped = self._scrape_registry()

    def _scrape_registry(self) -> CollectorRegistry:
        """What `/metrics` shows: this process's registry, or with several worker
        processes the sum of all of theirs (plus this worker's policy revision)."""
        directory = os.environ.get(MULTIPROC_DIR_ENV)
        if not directory:
            return self.registry
        scraped = CollectorRegistry()
        scraped.register(_FlushFirst(self))
        multiprocess.MultiProcessCollector(scraped, path=directory)  # type: ignore[no-untyped-call]
        scraped.register(self.policy_info)
        # The answering worker's own process and runtime figures.
        _runtime_collectors(scraped)
        return scraped

    def serving_tls(self) -> tuple[Gauge, Gauge]:
        """The listener serves TLS: the certificate's gauges, made on first use."""
        if self.tls_expiry is None or self.tls_reload_ok is None:
            self.tls_expiry = Gauge(
                "sidecar_tls_certificate_expiry_timestamp_seconds",
                "When the serving certificate expires (Unix time; its notAfter).",
                registry=self.registry,
                multiprocess_mode="livemin",
            )
            self.tls_reload_ok = Gauge(
                "sidecar_tls_certificate_reload_ok",
                "0 while the last change of the certificate files was refused (the last "
                "good pair keeps serving), else 1.",
                registry=self.registry,
                multiprocess_mode="livemin",
            )
        return self.tls_expiry, self.tls_reload_ok

    def refresh(self) -> None:
        """Run the refreshers (gauges read from the services' state, cheap and sync)."""
        for refresher in self.refreshers:
            try:
                refresher()
            except Exception:  # a scrape must answer whatever a refresher does
                import logging

                logging.getLogger("sidecar").exception("a metrics refresher failed")

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
        """`metric.labels(*labels)` for the request path, cached: a tally for a
        counter (`inc`) or a histogram (`observe`), flushed by `flush()`; any other
        metric's own child. Label values must already be bounded (tenants through
        `tenant()`)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= MAX_CACHED_CHILDREN:
                self.flush()
                self._children.clear()
            found = metric.labels(*labels)
            if isinstance(metric, Counter):
                found = _Tally(found, self._dirty)
            elif isinstance(metric, Histogram):
                found = _Spread(found, self._dirty)
            self._children[key] = found
        return found

    def flush(self) -> None:
        """Move every tally into prometheus-client (on the event loop's thread)."""
        dirty = self._dirty  # the same list object stays shared with every tally
        if dirty:
            pending = dirty[:]
            dirty.clear()
            for tally in pending:
                tally.flush()
        if self.in_flight_now != self._in_flight_shown:
            self._in_flight_shown = self.in_flight_now
            self.in_flight.set(self.in_flight_now)

    async def flushing(self) -> AsyncIterator[None]:
        """Lifecycle: flush every FLUSH_SECONDS while the app runs, and at the end."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(FLUSH_SECONDS)
                self.flush()
                self.refresh()

        task = asyncio.create_task(loop(), name="metrics-flush")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.flush()

    def count_decision_cache(self, hit: bool) -> None:
        """One decision-cache lookup (`DecisionCache`'s counter)."""
        self.child(self.decision_cache, "hit" if hit else "miss").inc()

    def policy_reloaded(self, outcome: str) -> None:
        """A policy reload ended with `outcome` (`success`, `unchanged`, `failure`)."""
        self.policy_reloads.labels(outcome).inc()

    def policy_installed(self, revision: str, rules: int) -> None:
        """The policy in force: its revision and its rule count."""
        self.policy_info.info({"revision": revision})
        self.policy_rules.set(rules)

    def render(self) -> bytes:
        return generate_latest(self._scraped)

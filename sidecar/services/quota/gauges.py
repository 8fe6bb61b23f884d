"""The quota gauges on `/metrics` (`sidecar_quota_used`, `_in_progress`, `_hard`).

Stages mark a tenant whose usage may have changed (`mark`); every
`quota.gaugeIntervalSeconds` the marked tenants' gauges are refreshed from the ledger
(tenant-wide totals), so a create costs no ledger read for the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from sidecar.policy.kinds.quotas import QuotaPolicy, effective_limits
from sidecar.services.metrics import Metrics
from sidecar.services.quota.ledger import Ledger, LedgerError


class QuotaGauges:
    def __init__(
        self,
        ledger: Ledger,
        metrics: Metrics,
        quotas: Callable[[], QuotaPolicy],
        interval: float,
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.quotas = quotas
        self.interval = interval
        self._dirty: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def mark(self, tenant: str) -> None:
        self._dirty.add(tenant)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="quota-gauges")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            dirty, self._dirty = self._dirty, set()
            for tenant in dirty:
                with contextlib.suppress(LedgerError):
                    await self.refresh(tenant)

    async def refresh(self, tenant: str) -> None:
        """Refresh the used / in_progress / hard gauges of one tenant."""
        m = self.metrics
        label = m.tenant(tenant)
        if label != tenant:
            return  # past the label cap: per-tenant gauges would only mix tenants
        usage = await self.ledger.usage(tenant)
        file_limits, source = self.quotas().tenant_limits(tenant)
        hard, _ = effective_limits(file_limits, source, usage.limits.get("", {}))
        for res, n in usage.used.get("", {}).items():
            m.quota_used.labels(label, res).set(n)
        for res in set(usage.used.get("", {})) | set(usage.in_progress.get("", {})):
            m.quota_in_progress.labels(label, res).set(usage.get_in_progress("", res))
        for res, n in hard.items():
            m.quota_hard.labels(label, res).set(n)

"""The gauges an operator alerts on (deploy/monitoring/, docs/runbook.md): open watches
per tenant, the serving certificate's expiry, the policy source's state and the age of
the revision in force, and the ledger's state.

They are read from the services' own state by `refresh()`, which the metrics run
before every scrape and every `FLUSH_SECONDS` (`Metrics.refreshers`): reading a few
attributes, never awaiting anything. The ledger's state needs a call to the ledger,
so a background task runs the `/readyz` check `ledger` every `interval` seconds (the
same probe, single-flight with `/readyz` itself and bounded by its budget; a heartbeat
write) and `sidecar_ledger_up` follows it: it stays current even where nothing probes
`/readyz`. (Only that check: the others are read from state, and the upstream is never
asked more often than `/readyz` asks it.) A `/readyz` evaluation updates it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import TYPE_CHECKING

from sidecar.services.metrics import Metrics

if TYPE_CHECKING:
    from sidecar.edge.health import Readiness
    from sidecar.edge.tls import TlsReloader
    from sidecar.edge.watches import WatchRelay
    from sidecar.policy.source.store import PolicyStore

log = logging.getLogger("sidecar")

# How often the readiness checks (and so the ledger gauge) are evaluated at least.
DEFAULT_INTERVAL = 5.0


class OpsGauges:
    def __init__(
        self,
        metrics: Metrics,
        policy: PolicyStore,
        watches: WatchRelay,
        readiness: Readiness,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self.metrics = metrics
        self.policy = policy
        self.watches = watches
        self.readiness = readiness
        self.interval = interval if interval > 0 else DEFAULT_INTERVAL
        self.tls: TlsReloader | None = None
        # Tenants that had an open watch: their series go back to 0, never away.
        self._watch_tenants: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        metrics.refreshers.append(self.refresh)

    def serving_tls(self, tls: TlsReloader) -> None:
        """The listener's certificate (sidecar/cli/main.py): export its expiry."""
        self.tls = tls
        self.metrics.serving_tls()
        self.refresh()

    def refresh(self) -> None:
        m = self.metrics
        counts = Counter(
            m.tenant(w.ctx.identity.tenant if w.ctx.identity else None)
            for w in list(self.watches.watches.values())
        )
        for tenant in self._watch_tenants - counts.keys():
            m.watches_open.labels(tenant).set(0)
        for tenant, n in counts.items():
            m.watches_open.labels(tenant).set(n)
        self._watch_tenants |= counts.keys()
        m.policy_source_ok.set(0 if self.policy.last_error else 1)
        m.policy_loaded.set(self.policy.loaded_at)
        if self.tls is not None:
            expiry, reload_ok = m.serving_tls()
            expiry.set(self.tls.current.expires.timestamp())
            reload_ok.set(0 if self.tls.failed else 1)
        ledger = self.readiness.last.get("ledger")
        if ledger is not None:
            m.ledger_up.set(1 if ledger else 0)

    async def check(self) -> None:
        """One run of the ledger's readiness check, then a refresh."""
        await self.readiness.run_check("ledger")
        self.refresh()

    async def start(self) -> None:
        self.refresh()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="ops-gauges")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # the gauges must outlive any surprise
                log.exception("checking the ledger for the metrics failed")
            await asyncio.sleep(self.interval)

"""Reconcile: recount quota usage from the backing store's lists and correct drift.

The ledger's counters are a cache of the truth (Nova's lesson). For each tracked
resource the backing store is listed with paging (`?limit=500&continue=…`) as the
`system` tenant — cluster-wide (`/apis/compute/v1/servers`) for all tenants, or
`/apis/compute/v1/tenants/{t}/servers` for one — and each tenant's recorded objects
are replaced by what was listed (`Ledger.reconcile_set`). Objects committed or deleted
while the listing ran are kept as the ledger has them, and reservations are not
touched, except those marked unsettled (a create whose outcome no sidecar saw: DESIGN
§7), which are read back from the store one by one and committed or released
(`settle.settle_marked`). A resource the store does not serve (404) is left as it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sidecar.core.identity import Identity
from sidecar.core.quantities import TRACKED, QuantityError, Tracked
from sidecar.core.status import StatusError
from sidecar.services.quota.ledger import Ledger, LedgerError, ObjectRef, ReconcileResult
from sidecar.services.quota.meters import Charge, charge_for
from sidecar.services.quota.settle import settle_marked

if TYPE_CHECKING:
    from sidecar.upstream.client import UpstreamClient

log = logging.getLogger("sidecar.quota.reconcile")
PAGE_SIZE = 500
RECONCILER = Identity("system:quota-reconciler", "system", ("system:masters",), "internal")
# (path, query) → (status, JSON body)
Fetch = Callable[[str, list[tuple[str, str]]], Awaitable[tuple[int, Any]]]


class ReconcileError(Exception):
    pass


async def list_all(fetch: Fetch, path: str) -> list[dict[str, Any]] | None:
    """Every item of a paged list; None when the store does not serve the resource."""
    items: list[dict[str, Any]] = []
    token = ""
    for _ in range(100000):
        query = [("limit", str(PAGE_SIZE))]
        if token:
            query.append(("continue", token))
        status, body = await fetch(path, query)
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise ReconcileError(f"listing {path} answered {status}")
        page = body.get("items") or []
        if not isinstance(page, list):
            raise ReconcileError(f"listing {path}: items is not a list")
        items.extend(i for i in page if isinstance(i, dict))
        meta = body.get("metadata")
        token = meta.get("continue", "") if isinstance(meta, dict) else ""
        if not token:
            return items
    raise ReconcileError(f"listing {path} did not end")


def _object(tracked: Tracked, item: dict[str, Any]) -> tuple[ObjectRef, Charge] | None:
    meta = item.get("metadata")
    if not isinstance(meta, dict):
        return None
    tenant, name = meta.get("tenant"), meta.get("name")
    if not isinstance(tenant, str) or not isinstance(name, str) or not tenant or not name:
        return None
    namespace = meta.get("namespace") if tracked.namespaced else ""
    if not isinstance(namespace, str):
        return None
    try:
        charge = charge_for(tracked.resource, item)
    except QuantityError:
        charge = {tracked.resource: 1}
    return ObjectRef(tenant, namespace, tracked.resource, name), charge


async def reconcile(
    ledger: Ledger,
    fetch: Fetch,
    tenant: str | None = None,
    clock: Callable[[], float] | None = None,
) -> dict[str, ReconcileResult]:
    """Recount one tenant, or every tenant seen in the store or the ledger."""
    now = clock or ledger.clock
    started = now()
    covered: list[str] = []
    found: dict[str, dict[ObjectRef, Charge]] = {}
    for tracked in TRACKED.values():
        items = await list_all(fetch, tracked.list_path(tenant))
        if items is None:
            continue
        covered.append(tracked.resource)
        for item in items:
            got = _object(tracked, item)
            if got is None or (tenant is not None and got[0].tenant != tenant):
                continue
            found.setdefault(got[0].tenant, {})[got[0]] = got[1]
    tenants = {tenant} if tenant is not None else set(found) | set(await ledger.tenants())
    results: dict[str, ReconcileResult] = {}
    for t in sorted(tenants):
        results[t] = await ledger.reconcile_set(t, covered, found.get(t, {}), started)
        # Creates whose outcome no sidecar saw (cut at a shutdown, say): read back now.
        settled = await settle_marked(ledger, lambda path: fetch(path, []), t)
        if settled:
            log.info("quota reconcile %s: %d unsettled creates settled", t, settled)
    return results


def upstream_fetch(upstream: UpstreamClient) -> Fetch:
    """Lists of the backing store, read as the reconciler (the `system` tenant)."""

    async def fetch(path: str, query: list[tuple[str, str]]) -> tuple[int, Any]:
        return await upstream.get_json(path, RECONCILER, query)

    return fetch


async def reconcile_tenant(
    fetch: Fetch, ledger: Ledger, tenant: str | None, log_errors: bool = False
) -> dict[str, ReconcileResult]:
    try:
        results = await reconcile(ledger, fetch, tenant)
    except (ReconcileError, LedgerError, StatusError) as exc:
        if not log_errors:
            raise
        log.warning(
            "quota reconcile failed: %s", exc.detail if isinstance(exc, LedgerError) else exc
        )
        return {}
    for t, r in results.items():
        if r.added or r.removed or r.changed:
            log.info(
                "quota reconcile %s: +%d -%d ~%d, used %s → %s",
                t,
                r.added,
                r.removed,
                r.changed,
                r.before,
                r.after,
            )
    return results


async def periodic(fetch: Fetch, ledger: Ledger, interval: float) -> None:
    """Reconcile every tenant every `interval` seconds (config.quota.reconcileIntervalSeconds)."""
    while True:
        await asyncio.sleep(interval)
        t0 = time.monotonic()
        await reconcile_tenant(fetch, ledger, None, log_errors=True)
        log.debug("quota reconcile took %.3fs", time.monotonic() - t0)

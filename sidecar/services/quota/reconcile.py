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

Pages are read as a stream (`StoreReader.page`, `edge.proxy.Upstream.get_items`): each
item is handed over as it is parsed, a small piece at a time that takes turns with the
owner-filtered lists on the event loop, and of each item only what the ledger needs is
kept (its tenant, namespace, name and charge). So a reconcile's memory is one piece of
the answer, one item and one small record per object, whatever the pages' size, and no
page is parsed whole on the event loop.

`Reconciles` runs them single-flight: at most one reconcile of a tenant at a time in a
process, and a request while one runs asks for exactly one more run after it, however
many arrive. A deletecollection asks for one only when its answer says it deleted
something (`deleted_something`). A hostile review sent 24 deletecollections that
deleted nothing over 120 MB of a tenant's configmaps: each started a reconcile that
read every page whole and kept every item, 73 → 950 MiB, and other tenants waited up
to 1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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

# One element of a page's `items`, as parsed.
Item = Callable[[Any], None]
# (path, query, item) → (status, the page's other top-level fields): every element of
# the page's `items` handed to `item` as it is read, none kept.
ListPage = Callable[[str, list[tuple[str, str]], Item], Awaitable[tuple[int, dict[str, Any]]]]
# path → (status, JSON body): one object (settling unsettled creates).
GetJson = Callable[[str], Awaitable[tuple[int, Any]]]


@dataclass(frozen=True)
class StoreReader:
    """How a reconcile reads the backing store: pages streamed, single objects whole."""

    page: ListPage
    get: GetJson


class ReconcileError(Exception):
    pass


async def list_each(reader: StoreReader, path: str, item: Item) -> bool:
    """Hand every item of a paged list to `item`; False when the store does not serve
    the resource."""
    token = ""
    for _ in range(100000):
        query = [("limit", str(PAGE_SIZE))]
        if token:
            query.append(("continue", token))
        status, fields = await reader.page(path, query, item)
        if status == 404:
            return False
        if status != 200:
            raise ReconcileError(f"listing {path} answered {status}")
        meta = fields.get("metadata")
        token = (meta.get("continue") or "") if isinstance(meta, dict) else ""
        if not isinstance(token, str):
            raise ReconcileError(f"listing {path}: metadata.continue is not a string")
        if not token:
            return True
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
    reader: StoreReader,
    tenant: str | None = None,
    clock: Callable[[], float] | None = None,
) -> dict[str, ReconcileResult]:
    """Recount one tenant, or every tenant seen in the store or the ledger."""
    now = clock or ledger.clock
    started = now()
    covered: list[str] = []
    found: dict[str, dict[ObjectRef, Charge]] = {}

    def keep(tracked: Tracked) -> Item:
        def item(value: Any) -> None:
            got = _object(tracked, value) if isinstance(value, dict) else None
            if got is None or (tenant is not None and got[0].tenant != tenant):
                return
            found.setdefault(got[0].tenant, {})[got[0]] = got[1]

        return item

    for tracked in TRACKED.values():
        if await list_each(reader, tracked.list_path(tenant), keep(tracked)):
            covered.append(tracked.resource)
    tenants = {tenant} if tenant is not None else set(found) | set(await ledger.tenants())
    results: dict[str, ReconcileResult] = {}
    for t in sorted(tenants):
        results[t] = await ledger.reconcile_set(t, covered, found.get(t, {}), started)
        # Creates whose outcome no sidecar saw (cut at a shutdown, say): read back now.
        settled = await settle_marked(ledger, reader.get, t)
        if settled:
            log.info("quota reconcile %s: %d unsettled creates settled", t, settled)
    return results


def upstream_fetch(upstream: UpstreamClient) -> StoreReader:
    """The backing store read as the reconciler (the `system` tenant)."""

    async def page(
        path: str, query: list[tuple[str, str]], item: Item
    ) -> tuple[int, dict[str, Any]]:
        return await upstream.get_items(path, RECONCILER, query, item)

    async def get(path: str) -> tuple[int, Any]:
        return await upstream.get_json(path, RECONCILER)

    return StoreReader(page, get)


async def reconcile_tenant(
    reader: StoreReader, ledger: Ledger, tenant: str | None, log_errors: bool = False
) -> dict[str, ReconcileResult]:
    try:
        results = await reconcile(ledger, reader, tenant)
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


async def periodic(reader: StoreReader, ledger: Ledger, interval: float) -> None:
    """Reconcile every tenant every `interval` seconds (config.quota.reconcileIntervalSeconds)."""
    while True:
        await asyncio.sleep(interval)
        t0 = time.monotonic()
        await reconcile_tenant(reader, ledger, None, log_errors=True)
        log.debug("quota reconcile took %.3fs", time.monotonic() - t0)


class Reconciles:
    """Reconciles of single tenants in this process, single-flight: at most one of a
    tenant at a time; a request while one runs asks for one more run after it (the
    requests that arrive meanwhile all become that one run). Errors are logged."""

    def __init__(self, reader: StoreReader, ledger: Ledger) -> None:
        self.reader = reader
        self.ledger = ledger
        self.runs = 0  # reconciles started, for tests and the log
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    def request(self, tenant: str) -> None:
        """Reconcile `tenant` now, or once more after the run in progress."""
        if tenant in self._running:
            self._again.add(tenant)
            return
        self._running[tenant] = asyncio.ensure_future(self._run(tenant))

    def running(self, tenant: str) -> bool:
        return tenant in self._running

    async def _run(self, tenant: str) -> None:
        try:
            while True:
                self._again.discard(tenant)
                self.runs += 1
                await reconcile_tenant(self.reader, self.ledger, tenant, log_errors=True)
                # No await between this check and leaving `_running`: a request is
                # either seen here or starts a new run.
                if tenant not in self._again:
                    return
        finally:
            self._running.pop(tenant, None)
            self._again.discard(tenant)

    async def stop(self) -> None:
        """Shutdown: reconciles in progress are cancelled (the next one recounts)."""
        tasks = list(self._running.values())
        self._again.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def deleted_something(answer: bytes | None) -> bool:
    """Whether a successful deletecollection's answer says it deleted something, so
    that the tenant's usage must be recounted. A list with items (Kubernetes answers
    the deleted objects) or a Status with `details.deleted` above 0 (the reference
    store) did; a list with no items, or that Status with 0, did not. An answer that
    does not say (`None`: streamed, too large to hold; not JSON; another shape) counts
    as having deleted something: the recount is never skipped on a guess."""
    if answer is None:
        return True
    try:
        body = json.loads(answer)
    except (ValueError, UnicodeDecodeError):
        return True
    if not isinstance(body, dict):
        return True
    items = body.get("items", _ABSENT)
    if items is not _ABSENT:
        return not (items is None or items == [])
    details = body.get("details")
    deleted = details.get("deleted") if isinstance(details, dict) else None
    if body.get("kind") == "Status" and type(deleted) is int:
        return deleted > 0
    return True


_ABSENT = object()

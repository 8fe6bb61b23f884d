"""The quota stage: reserve before a quota-tracked create, commit or release after it.

A create of a tracked resource (meters.TRACKED) reads its body, computes its charge
(400 on unparsable cpu/memory, nothing reserved), reserves it atomically in the
tenant and namespace scopes, forwards, then commits on a 2xx answer (recording the
object's charge under its name, taken from the response) or releases on anything
else: another status, an exception, a timeout, a client disconnect. A successful
DELETE returns the object's recorded charge; a deleted namespace or tenant returns
all of its objects' charges, and a deletecollection triggers a reconcile of the tenant.
Over quota → 403 QuotaExceeded (in dry-run: counted, logged, forwarded). A ledger
that cannot be reached → 503 on tracked creates only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import web

from sidecar.context import RequestContext
from sidecar.errors import StatusError, bad_request
from sidecar.pipeline import Handler, Stage
from sidecar.policy.modes import DRY_RUN, mode_for
from sidecar.quota.ledger import (
    Ledger,
    LedgerError,
    ObjectRef,
    QuotaExceeded,
    Reservation,
    open_ledger,
    reservation_id,
)
from sidecar.quota.meters import QuantityError, Tracked, charge_for, format_units, tracked_for
from sidecar.runtime import Runtime
from sidecar.target import RequestTarget, Scope

log = logging.getLogger("sidecar.quota")
LEDGER_KEY = "quota.ledger"
GAUGE_INTERVAL = 5.0


def ledger_for(rt: Runtime) -> Ledger:
    """The process's one ledger, shared by the stage, the API and reconcile."""
    existing = rt.extras.get(LEDGER_KEY)
    if isinstance(existing, Ledger):
        return existing
    ledger = open_ledger(rt.config.ledger, rt.config.quota.reservation_ttl_seconds,
                         redis_prefix=rt.config.quota.redis_prefix)
    rt.extras[LEDGER_KEY] = ledger

    async def ready() -> tuple[bool, str]:
        try:
            await ledger.ping()
        except LedgerError as exc:
            return False, str(exc)
        return True, "ledger reachable"

    async def close() -> None:
        await ledger.close()

    rt.ready_checks["ledger"] = ready
    rt.on_cleanup.append(close)
    return ledger


def quota_message(e: QuotaExceeded) -> str:
    where = f"tenant {e.tenant}" if e.scope == "tenant" else f"namespace {e.tenant}/{e.namespace}"
    def f(n: int) -> str:
        return str(format_units(e.resource, n))
    return (
        f"exceeded quota in {where}: {e.resource} requested {f(e.requested)}, "
        f"used {f(e.used)}, in progress {f(e.in_progress)}, limit {f(e.limit)}"
    )


def quota_error(e: QuotaExceeded) -> StatusError:
    return StatusError(
        403,
        quota_message(e),
        reason="QuotaExceeded",
        details={
            "scope": e.scope,
            "tenant": e.tenant,
            "namespace": e.namespace or None,
            "resource": e.resource,
            "requested": format_units(e.resource, e.requested),
            "used": format_units(e.resource, e.used),
            "inProgress": format_units(e.resource, e.in_progress),
            "limit": format_units(e.resource, e.limit),
        },
    )


class QuotaStage:
    name = "quota"

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.ledger = ledger_for(rt)
        self.metrics = rt.metrics
        self._dirty: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gauge_task: asyncio.Task[None] | None = None
        rt.on_startup.append(self._start)
        rt.on_cleanup.append(self._stop)

    async def _start(self) -> None:
        self._gauge_task = asyncio.create_task(self._gauge_loop())
        interval = self.rt.config.quota.reconcile_interval_seconds
        if interval > 0:
            from sidecar.quota.reconcile import periodic

            self._spawn(periodic(self.rt, self.ledger, interval))

    async def _stop(self) -> None:
        tasks = list(self._tasks)
        if self._gauge_task is not None:
            tasks.append(self._gauge_task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        target, identity = ctx.target, ctx.identity
        if target is None or identity is None or not target.resource_request:
            return await call_next(ctx)
        if target.subresource:
            return await call_next(ctx)
        target = target.resolve_tenant(identity.tenant)
        if target.verb == "create":
            tracked = _tracked_create(target)
            if tracked is not None:
                return await self._create(ctx, call_next, target, tracked)
        elif target.verb in ("delete", "deletecollection"):
            response = await call_next(ctx)
            if 200 <= response.status < 300:
                await self._after_delete(target)
            return response
        return await call_next(ctx)

    # -- creates ----------------------------------------------------------------------

    async def _create(
        self, ctx: RequestContext, call_next: Handler, target: RequestTarget, tracked: Tracked
    ) -> web.StreamResponse:
        assert ctx.identity is not None and target.tenant is not None
        identity = ctx.identity
        tenant = target.tenant
        namespace = target.namespace or ""
        raw = await ctx.read_body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            raise bad_request("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        try:
            charge = charge_for(tracked.resource, body)
        except QuantityError as exc:
            raise bad_request(f"invalid resource requests: {exc}") from None
        bundle = ctx.policy
        quotas = bundle.quotas
        tenant_limits, _ = quotas.tenant_limits(tenant)
        ns_limits = quotas.namespace_limits(tenant, namespace) if namespace else {}
        rid, idem = reservation_id(tenant, identity.user,
                                   ctx.request.headers.get("Idempotency-Key"))
        mode = mode_for(self.rt.config.mode, bundle.tenant_modes, identity.tenant)
        label = self.metrics.tenant(tenant)
        try:
            reservation = await self.ledger.reserve(
                tenant, namespace, charge, tenant_limits, ns_limits, rid, idem
            )
        except QuotaExceeded as exc:
            self.metrics.quota_refusals.labels(label, exc.resource).inc()
            self._dirty.add(tenant)
            if mode != DRY_RUN:
                ctx.audit["quota"] = "refused"
                raise quota_error(exc) from None
            ctx.audit["quota"] = "would_refuse: " + quota_message(exc)
            # Forward anyway; a 2xx still charges `used` (commit needs no reservation).
            reservation = Reservation(rid, tenant, namespace, charge)
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("reserve").inc()
            log.warning("quota ledger unreachable on reserve: %s", exc)
            raise StatusError(503, "the quota ledger is unreachable; creates of "
                              f"{tracked.resource} are refused until it is back") from None
        else:
            ctx.audit.setdefault("quota", "reused" if reservation.reused else "reserved")
        self._dirty.add(tenant)

        captured: dict[str, bytes] = {}
        previous = ctx.response_filter

        def capture(status: int, data: bytes) -> bytes:
            if previous is not None:
                data = previous(status, data)
            captured["body"] = data
            return data

        ctx.response_filter = capture
        done = False
        try:
            response = await call_next(ctx)
            if 200 <= response.status < 300:
                name = _created_name(captured.get("body"), body) or f"unnamed-{reservation.id}"
                done = True
                await self._commit(reservation, name, tracked.resource)
            return response
        finally:
            if not done:
                # Shielded: a client disconnect cancels this task, the release must run.
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._release(reservation))

    async def _commit(self, reservation: Reservation, name: str, resource: str) -> None:
        try:
            await self.ledger.commit(reservation, name, resource)
        except LedgerError as exc:
            # The object exists; its reservation expires and reconcile recounts it.
            self.metrics.ledger_errors.labels("commit").inc()
            log.warning("quota commit of %s/%s failed: %s", resource, name, exc)

    async def _release(self, reservation: Reservation) -> None:
        try:
            await self.ledger.release(reservation)
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("release").inc()
            log.warning("quota release failed (expires after the TTL): %s", exc)

    # -- deletes ------------------------------------------------------------------------

    async def _after_delete(self, target: RequestTarget) -> None:
        try:
            if target.verb == "delete":
                if target.scope == Scope.CLUSTER and target.resource == "tenants":
                    await self.ledger.delete_scope(target.name, None)
                elif (target.scope == Scope.TENANT and target.resource == "namespaces"
                      and target.tenant):
                    await self.ledger.delete_scope(target.tenant, target.name)
                elif _tracked_item(target) and target.tenant:
                    await self.ledger.delete(ObjectRef(
                        target.tenant, target.namespace or "", target.resource, target.name))
                else:
                    return
                self._dirty.add(target.tenant or target.name)
            elif _tracked_item(target) is not None and target.tenant:
                from sidecar.quota.reconcile import reconcile_tenant

                self._spawn(reconcile_tenant(self.rt, self.ledger, target.tenant, log_errors=True))
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("delete").inc()
            log.warning("quota delete bookkeeping failed (reconcile corrects it): %s", exc)

    # -- gauges -------------------------------------------------------------------------

    async def _gauge_loop(self) -> None:
        while True:
            await asyncio.sleep(GAUGE_INTERVAL)
            dirty, self._dirty = self._dirty, set()
            for tenant in dirty:
                with contextlib.suppress(LedgerError):
                    await update_gauges(self.rt, self.ledger, tenant)


async def update_gauges(rt: Runtime, ledger: Ledger, tenant: str) -> None:
    """Refresh the used / in_progress / hard gauges of one tenant (tenant-wide totals)."""
    from sidecar.quota.spec import effective_limits

    label = rt.metrics.tenant(tenant)
    if label != tenant:
        return  # past the label cap: per-tenant gauges would only mix tenants
    usage = await ledger.usage(tenant)
    file_limits, source = rt.policy.current.quotas.tenant_limits(tenant)
    hard, _ = effective_limits(file_limits, source, usage.limits.get("", {}))
    m = rt.metrics
    for res, n in usage.used.get("", {}).items():
        m.quota_used.labels(label, res).set(n)
    for res in set(usage.used.get("", {})) | set(usage.in_progress.get("", {})):
        m.quota_in_progress.labels(label, res).set(usage.get_in_progress("", res))
    for res, n in hard.items():
        m.quota_hard.labels(label, res).set(n)


def _tracked_create(target: RequestTarget) -> Tracked | None:
    if target.name:
        return None
    tracked = tracked_for(target.api_group, target.resource)
    if tracked is None or not target.tenant:
        return None
    wanted = Scope.NAMESPACE if tracked.namespaced else Scope.TENANT
    return tracked if target.scope == wanted else None


def _tracked_item(target: RequestTarget) -> Tracked | None:
    tracked = tracked_for(target.api_group, target.resource)
    if tracked is None:
        return None
    wanted = Scope.NAMESPACE if tracked.namespaced else Scope.TENANT
    return tracked if target.scope == wanted else None


def _created_name(response_body: bytes | None, request_body: dict[str, Any]) -> str:
    for source in (response_body, request_body):
        obj: Any = source
        if isinstance(source, bytes):
            try:
                obj = json.loads(source)
            except ValueError:
                continue
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(name, str) and name:
            return name
    return ""


def make_stage(rt: Runtime) -> Stage:
    return QuotaStage(rt)

"""The quota stage: reserve before a quota-tracked create or update, commit or release
after it.

Creates: a create of a tracked resource (meters.TRACKED) reads its body, computes its
charge (400 on unparsable cpu/memory, nothing reserved), reserves it atomically in the
tenant and namespace scopes, forwards, then commits on a 2xx answer (recording the
object's charge under its name, taken from the response) or releases on anything
else: another status, an exception, a 502/504, a client disconnect (cancellation).
An `Idempotency-Key` is a claim on the reservation (ledger.Claim): the same key with
another path or body → 422, a retry while the first is in flight → 409, and a key
never skips the quota check.

Updates and patches of a tracked object: the stage claims the object in the ledger
(one update of it in flight at a time, else 409), reads it fresh from the store,
applies the PUT body or the patch to it (patch.py), computes the new charge with the
same `charge_for` as creates, reserves the increase over the recorded charge (403
QuotaExceeded when there is no room), forwards, and on a 2xx records the new charge
(a decrease is returned); anything else releases.

A successful DELETE returns the object's recorded charge; a deleted namespace or
tenant returns all of its objects' charges, and a deletecollection triggers a
reconcile of the tenant. Over quota → 403 QuotaExceeded (in dry-run: counted, logged,
forwarded). A `dryRun=All` write (`is_dry_run_all`) is checked like any other (its
reservation is released at once, before forwarding) and never committed; its delete
returns no charge. A ledger that cannot be reached → 503 on tracked creates and on updates
that raise a charge; its detail goes to the log, never into the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sidecar.context import RequestContext
from sidecar.errors import StatusError, bad_request, not_found
from sidecar.metrics import Metrics
from sidecar.pipeline import Handler
from sidecar.quantities import QuantityError, Tracked, format_units, tracked_for
from sidecar.quota.gauges import QuotaGauges
from sidecar.quota.ledger import (
    Claim,
    ClaimConflict,
    Ledger,
    LedgerError,
    ObjectRef,
    QuotaExceeded,
    Reservation,
    charge_delta,
    idempotency_claim,
    new_reservation_id,
    object_claim,
)
from sidecar.quota.meters import Charge, charge_for
from sidecar.quota.patch import MERGE, patch_kind, updated_object
from sidecar.quota.reconcile import reconcile_tenant, upstream_fetch
from sidecar.target import RequestTarget, Scope

if TYPE_CHECKING:
    from sidecar.proxy import Upstream

log = logging.getLogger("sidecar.quota")


async def ledger_ready(ledger: Ledger) -> tuple[bool, str]:
    """The `/readyz` check of the ledger (not required: reads work without it)."""
    try:
        await ledger.ping()
    except LedgerError as exc:
        log.debug("quota ledger not ready: %s", exc.detail)  # requests log it too
        return False, f"ledger unavailable: {exc.reason}"
    return True, "ledger reachable"


def ledger_unavailable(exc: LedgerError, op: str, refused: str) -> StatusError:
    """The 503 for a ledger failure: the detail (paths, URLs, driver text) is logged,
    the body says only what is refused."""
    log.warning("quota ledger failed on %s: %s", op, exc.detail)
    return StatusError(503, f"the quota ledger is unavailable; {refused} until it is back")


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

    def __init__(
        self,
        ledger: Ledger,
        metrics: Metrics,
        gauges: QuotaGauges,
        upstream: Upstream,
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.gauges = gauges
        self.upstream = upstream
        self.reconcile_fetch = upstream_fetch(upstream)
        # Work that outlives its request: late releases, reconciles after deletes.
        self._tasks: set[asyncio.Task[Any]] = set()

    async def stop(self) -> None:
        tasks = list(self._tasks)
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
        dry = await is_dry_run_all(ctx) if target.verb in WRITE_VERBS else False
        if target.verb == "create":
            tracked = _tracked_create(target)
            if tracked is not None:
                return await self._create(ctx, call_next, target, tracked, dry)
        elif target.verb in ("update", "patch"):
            tracked = _tracked_item(target)
            if tracked is not None and target.name and target.tenant:
                return await self._update(ctx, call_next, target, tracked, dry)
        elif target.verb in ("delete", "deletecollection"):
            response = await call_next(ctx)
            if 200 <= response.status < 300 and not dry:
                await self._after_delete(target)
            return response
        return await call_next(ctx)

    # -- creates ----------------------------------------------------------------------

    async def _create(
        self,
        ctx: RequestContext,
        call_next: Handler,
        target: RequestTarget,
        tracked: Tracked,
        dry: bool = False,
    ) -> web.StreamResponse:
        assert ctx.identity is not None and target.tenant is not None
        tenant = target.tenant
        namespace = target.namespace or ""
        body = await ctx.read_json()
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        charge = _charge(tracked, body)
        claim = None if dry else _idempotency(ctx)
        quotas = ctx.policy.quotas
        tenant_limits, _ = quotas.tenant_limits(tenant)
        ns_limits = quotas.namespace_limits(tenant, namespace) if namespace else {}
        rid = new_reservation_id()
        try:
            reservation = await self._guarded(
                lambda: self.ledger.reserve(
                    tenant, namespace, charge, tenant_limits, ns_limits, rid, claim
                )
            )
        except QuotaExceeded as exc:
            self._refused(ctx, exc)
            # Dry-run: forward anyway; a 2xx still charges `used` (commit needs no
            # reservation).
            reservation = Reservation(rid, tenant, namespace, charge)
        except ClaimConflict as exc:
            if exc.in_flight:
                raise StatusError(
                    409,
                    "a request with this Idempotency-Key is still in "
                    "progress; retry after it has completed",
                ) from None
            raise StatusError(
                422,
                "this Idempotency-Key was already used for a different "
                "request (another path or body)",
            ) from None
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("reserve").inc()
            raise ledger_unavailable(
                exc, "reserve", f"creates of {tracked.resource} are refused"
            ) from None
        else:
            ctx.audit.setdefault("quota", "reserved")
        self.gauges.mark(tenant)
        if dry:
            await self._release_shielded(reservation)
            return await self._checked_only(ctx, call_next)

        ctx.read_whole_answer = True
        done = False
        try:
            response = await call_next(ctx)
            if 200 <= response.status < 300:
                name = _created_name(_answer(response), body) or f"unnamed-{reservation.id}"
                done = True
                await asyncio.shield(self._commit(reservation, name, tracked.resource))
            return response
        finally:
            if not done:
                await self._release_shielded(reservation)

    async def _guarded(self, reserve: Callable[[], Awaitable[Reservation]]) -> Reservation:
        """Run a reserve so that a cancellation (client gone) mid-call never leaks it:
        the call finishes in the background and what it reserved is released."""
        task = asyncio.ensure_future(reserve())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:

            def release_late(t: asyncio.Future[Reservation]) -> None:
                if not t.cancelled() and t.exception() is None:
                    self._spawn(self._release(t.result()))

            task.add_done_callback(release_late)
            raise

    def _refused(self, ctx: RequestContext, exc: QuotaExceeded) -> None:
        """Count a refusal; raise the 403 unless the caller's tenant is in dry-run."""
        assert ctx.identity is not None
        self.metrics.quota_refusals.labels(self.metrics.tenant(exc.tenant), exc.resource).inc()
        self.gauges.mark(exc.tenant)
        if not ctx.dry_run:
            ctx.audit["quota"] = "refused"
            raise quota_error(exc) from None
        ctx.audit["quota"] = "would_refuse: " + quota_message(exc)

    async def _commit(self, reservation: Reservation, name: str, resource: str) -> None:
        try:
            await self.ledger.commit(reservation, name, resource)
        except LedgerError as exc:
            # The object exists; its reservation expires and reconcile recounts it.
            self.metrics.ledger_errors.labels("commit").inc()
            log.warning("quota commit of %s/%s failed: %s", resource, name, exc.detail)

    async def _release(self, reservation: Reservation) -> None:
        try:
            await self.ledger.release(reservation)
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("release").inc()
            log.warning("quota release failed (expires after the TTL): %s", exc.detail)

    async def _release_shielded(self, reservation: Reservation) -> None:
        # Shielded: a client disconnect cancels this task, the release must still run.
        with contextlib.suppress(BaseException):
            await asyncio.shield(self._release(reservation))

    # -- updates and patches ----------------------------------------------------------

    async def _update(
        self,
        ctx: RequestContext,
        call_next: Handler,
        target: RequestTarget,
        tracked: Tracked,
        dry: bool = False,
    ) -> web.StreamResponse:
        assert ctx.identity is not None and target.tenant is not None
        method = ctx.request.method
        request = ctx.request
        ctype = request.content_type if "Content-Type" in request.headers else None
        kind = patch_kind(ctype) if method == "PATCH" else MERGE
        body = await ctx.read_json()
        tenant, namespace = target.tenant, target.namespace or ""
        obj = ObjectRef(tenant, namespace, tracked.resource, target.name)
        # Claim the object first, then read it: no other update of it can land between
        # the read and this update's commit.
        lock: Reservation | None = None
        ledger_down: LedgerError | None = None
        try:
            lock = await self._guarded(
                lambda: self.ledger.reserve(
                    tenant, namespace, {}, {}, {}, new_reservation_id(), object_claim(obj)
                )
            )
        except ClaimConflict:
            raise StatusError(
                409, f'another update of {tracked.resource} "{target.name}" is in progress; retry'
            ) from None
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("reserve").inc()
            ledger_down = exc
        done = False
        try:
            current = await self._fresh(ctx, target, tracked)
            new_charge = _charge(tracked, updated_object(method, kind, current, body))
            try:
                base = charge_for(tracked.resource, current)
            except QuantityError:
                base = {tracked.resource: 1}
            raises = any(d > 0 for d in charge_delta(new_charge, base).values())
            if lock is None:
                assert ledger_down is not None
                if raises:
                    raise ledger_unavailable(
                        ledger_down,
                        "reserve",
                        f"updates that raise the charge of {tracked.resource} are refused",
                    )
                log.warning("quota ledger failed on update: %s", ledger_down.detail)
                ctx.audit["quota"] = "unrecorded"
                return await call_next(ctx)
            quotas = ctx.policy.quotas
            tenant_limits, _ = quotas.tenant_limits(tenant)
            ns_limits = quotas.namespace_limits(tenant, namespace) if namespace else {}
            try:
                lock = await self.ledger.reserve_change(
                    lock, obj, new_charge, base, tenant_limits, ns_limits
                )
            except QuotaExceeded as exc:
                self._refused(ctx, exc)
            except LedgerError as exc:
                self.metrics.ledger_errors.labels("reserve").inc()
                raise ledger_unavailable(
                    exc, "reserve", f"updates of {tracked.resource} are refused"
                ) from None
            else:
                ctx.audit.setdefault("quota", "reserved" if lock.charge else "unchanged")
            self.gauges.mark(tenant)
            if dry:
                await self._release_shielded(lock)
                lock = None
                return await self._checked_only(ctx, call_next)
            ctx.read_whole_answer = True
            response = await call_next(ctx)
            if 200 <= response.status < 300:
                done = True
                final = _response_charge(tracked, _answer(response)) or new_charge
                await asyncio.shield(self._commit_change(lock, obj, final))
            return response
        finally:
            if lock is not None and not done:
                await self._release_shielded(lock)

    async def _fresh(
        self, ctx: RequestContext, target: RequestTarget, tracked: Tracked
    ) -> dict[str, Any]:
        """The object as the store has it now (never a cached copy)."""
        status, current = await self.upstream.get_json(
            ctx.request.rel_url.raw_path, ctx.identity, request_id=ctx.request_id
        )
        if status == 404:
            raise not_found(tracked.resource, target.name)
        if status != 200 or not isinstance(current, dict):
            code = status if 400 <= status < 500 else 502
            raise StatusError(
                code,
                f'reading {tracked.resource} "{target.name}" before the '
                f"update failed: the backing store answered {status}",
            )
        return current

    async def _commit_change(
        self, reservation: Reservation, obj: ObjectRef, charge: Charge
    ) -> None:
        try:
            await self.ledger.commit_change(reservation, obj, charge)
        except LedgerError as exc:
            # The object changed; the claim expires and reconcile recounts the object.
            self.metrics.ledger_errors.labels("commit").inc()
            log.warning(
                "quota commit of the update of %s/%s failed: %s", obj.resource, obj.name, exc.detail
            )

    # -- deletes ------------------------------------------------------------------------

    async def _after_delete(self, target: RequestTarget) -> None:
        try:
            if target.verb == "delete":
                if target.scope == Scope.CLUSTER and target.resource == "tenants":
                    await self.ledger.delete_scope(target.name, None)
                elif (
                    target.scope == Scope.TENANT
                    and target.resource == "namespaces"
                    and target.tenant
                ):
                    await self.ledger.delete_scope(target.tenant, target.name)
                elif _tracked_item(target) and target.tenant:
                    await self.ledger.delete(
                        ObjectRef(
                            target.tenant, target.namespace or "", target.resource, target.name
                        )
                    )
                else:
                    return
                self.gauges.mark(target.tenant or target.name)
            elif _tracked_item(target) is not None and target.tenant:
                self._spawn(
                    reconcile_tenant(
                        self.reconcile_fetch, self.ledger, target.tenant, log_errors=True
                    )
                )
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("delete").inc()
            log.warning("quota delete bookkeeping failed (reconcile corrects it): %s", exc.detail)

    # -- dryRun=All ----------------------------------------------------------------------

    async def _checked_only(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        """A `dryRun=All` write whose quota check passed (and whose reservation is already
        released): forwarded with its dryRun, never committed, nothing charged."""
        ctx.audit["quota"] = "checked (dryRun=All)"
        return await call_next(ctx)


# -- dryRun=All: is this write a dry run? ----------------------------------------------

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
DRY_RUN_ALL = "All"


async def is_dry_run_all(ctx: RequestContext) -> bool:
    """Whether a write is a `dryRun=All` (DESIGN §7): such a write is checked against
    the quota but charges nothing, and the store validates it and stores nothing.

    Kubernetes takes `?dryRun=All` on every write, and on a delete also `"dryRun":
    ["All"]` in a DeleteOptions body, which is where `kubectl delete --dry-run=server`
    puts it. `All` is the only value: another (an empty one included) is 400."""
    request = ctx.request
    values: list[object] = list(request.query.getall("dryRun", []))
    if request.method == "DELETE" and request.body_exists:
        options = await ctx.read_json()
        if isinstance(options, dict) and "dryRun" in options:
            listed = options["dryRun"]
            if not isinstance(listed, list):
                raise bad_request('DeleteOptions.dryRun must be a list, e.g. ["All"]')
            values.extend(listed)
    for value in values:
        if value != DRY_RUN_ALL:
            raise bad_request(
                f"invalid dryRun value {repr(value)[:40]}: the only supported value is "
                f"{DRY_RUN_ALL!r}"
            )
    return bool(values)


def _charge(tracked: Tracked, obj: dict[str, Any]) -> Charge:
    try:
        return charge_for(tracked.resource, obj)
    except QuantityError as exc:
        raise bad_request(f"invalid resource requests: {exc}") from None


def _response_charge(tracked: Tracked, raw: bytes | None) -> Charge | None:
    """The charge of the object the store answered with (None when it cannot tell)."""
    try:
        obj = json.loads(raw) if raw else None
        return charge_for(tracked.resource, obj) if isinstance(obj, dict) else None
    except (ValueError, QuantityError):
        return None


def _answer(response: web.StreamResponse) -> bytes | None:
    """The body of an answer the proxy read whole (`ctx.read_whole_answer`)."""
    body = response.body if isinstance(response, web.Response) else None
    return body if isinstance(body, bytes) else None


MAX_IDEMPOTENCY_KEY = 255


def _idempotency(ctx: RequestContext) -> Claim | None:
    """The create's `Idempotency-Key` claim, scoped to the caller's tenant."""
    assert ctx.identity is not None
    keys = ctx.request.headers.getall("Idempotency-Key", [])
    if not keys:
        return None
    key = keys[0].strip()
    if len(keys) > 1 or not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise bad_request(
            f"Idempotency-Key must be one header of 1 to {MAX_IDEMPOTENCY_KEY} characters"
        )
    request = ctx.request
    return idempotency_claim(
        ctx.identity.tenant, key, request.method, request.raw_path, ctx.body or b""
    )


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

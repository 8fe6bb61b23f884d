"""The quota stage: reserve before a quota-tracked create or update, then commit,
release or settle after it (DESIGN §7).

Creates: a create of a tracked resource (quantities.TRACKED) reads its body, computes
its charge (400 on unparsable cpu/memory, nothing reserved), reserves it atomically in
the tenant and namespace scopes, forwards, then:
- a 2xx answer commits, recording the charge of the object the store answered with
  (not as sent) under its name taken from the answer;
- a 4xx answer, or a request that never reached the upstream, releases;
- anything else is an outcome the sidecar did not see (a 5xx, a timeout, a cut
  connection or answer, the client or the sidecar going away): the reservation stays
  in progress and is settled against the store by `settle.Settler` (read the object
  by name: commit when found, release when not found once the settling window has
  passed, since the upstream may still be making it), never assumed either way.
An `Idempotency-Key` is a claim on the reservation (ledger.Claim): the same key with
another path or body → 422, a retry while the first is in flight → 409, a retry after
the first succeeded gets its answer replayed (`Idempotency-Replayed: true`) whatever
the quota says now, and a key never lets a different create skip the check.

Updates and patches of a tracked object: the stage claims the object in the ledger
(one update of it in flight at a time, else 409), sends the same request to the
upstream as a `dryRun=All` (`Upstream.dry_run`) and charges the object in that answer
with the same `charge_for` as creates, so every patch type is charged exactly as the
upstream applies it (the sidecar holds no patch code); a refused dry run is answered
as the upstream answered it. It reserves the increase over the recorded charge (403
QuotaExceeded when there is no room), forwards, and on a 2xx records the stored
object's charge (a decrease is returned); a 4xx releases; an unseen outcome is
settled by reading the object (the increase stays reserved until the object is seen
with the charge the dry run gave it, or the settling window has passed).

A ledger call whose answer was lost (a timeout: it may have run) is made again until
the ledger answers (a reserve that failed is released, a commit or a delete made);
every ledger operation is idempotent (by reservation id; a delete by the object and
when it was deleted).

A successful DELETE returns the object's recorded charge; a deleted namespace or
tenant returns all of its objects' charges (a ledger that fails meanwhile is asked
again until it answers), and a deletecollection that deleted something triggers a
reconcile of the tenant (one at a time per tenant: `reconcile.Reconciles`).
Over quota → 403 QuotaExceeded (in dry-run mode, for the caller's own tenant:
counted, logged, forwarded). A `dryRun=All` write
(`is_dry_run_all`) is checked like any other (its reservation is released at once,
before forwarding) and never committed; its delete returns no charge. A ledger that
cannot be reached → 503 on tracked creates and on updates that raise a charge; its
detail goes to the log, never into the body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

from aiohttp import web

from sidecar.config.settings import Config
from sidecar.core.quantities import QuantityError, Tracked, format_units, tracked_for
from sidecar.core.status import StatusError, bad_request, not_found
from sidecar.core.target import RequestTarget, Scope
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.policy.isolation import inside_caller_tenant
from sidecar.services.metrics import Metrics
from sidecar.services.quota.gauges import QuotaGauges
from sidecar.services.quota.ledger import (
    Answer,
    Claim,
    ClaimConflict,
    ClaimReplay,
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
from sidecar.services.quota.meters import Charge, charge_for
from sidecar.services.quota.reconcile import (
    RECONCILER,
    Reconciles,
    deleted_something,
    upstream_fetch,
)
from sidecar.services.quota.settle import Settler
from sidecar.upstream.client import DryRunAnswer, UpstreamClient, UpstreamError
from sidecar.upstream.pool import UpstreamUnreachable
from sidecar.upstream.preconditions import (
    MAX_ATTEMPTS,
    DecidedState,
    StateChanged,
    conflict,
    parse_write_body,
)

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


class QuotaUpstream(UpstreamClient, Protocol):
    """The upstream calls the quota stage makes (`edge.proxy.Upstream` implements them)."""

    config: Config

    async def dry_run(self, ctx: RequestContext) -> DryRunAnswer: ...


class QuotaStage:
    name = "quota"

    def __init__(
        self,
        ledger: Ledger,
        metrics: Metrics,
        gauges: QuotaGauges,
        upstream: QuotaUpstream,
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.gauges = gauges
        self.upstream = upstream
        # Reconciles of a tenant after a deletecollection: one at a time per tenant.
        self.reconciles = Reconciles(upstream_fetch(upstream), ledger)
        # Work that outlives its request: settling unknown outcomes, ledger calls made
        # again, reconciles after deletes.
        self.settler = Settler(
            ledger,
            self._read_stored,
            lambda op: metrics.ledger_errors.labels(op).inc(),
            upstream.config.quota.settle_after_seconds,
        )

    async def _read_stored(self, path: str) -> tuple[int, Any]:
        return await self.upstream.get_json(path, RECONCILER)

    async def start(self) -> None:
        """Settle what earlier processes left unsettled (now, then now and then)."""
        self.settler.start()

    async def stop(self) -> None:
        """Shutdown: what is not settled stays in progress in the ledger."""
        await self.reconciles.stop()
        await self.settler.stop()

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        target, identity = ctx.target, ctx.identity
        if target is None or identity is None or not target.resource_request:
            return await call_next(ctx)
        if target.subresource:
            if _is_eviction(target):  # evicting deletes the pod (`kubectl drain`)
                return await self._evicted(ctx, call_next, target)
            if target.verb in WRITE_VERBS and target.name and target.tenant:
                tracked = _tracked_item(target)
                if tracked is not None:
                    return await self._subresource_write(ctx, call_next, target, tracked)
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
            # The delete is booked as made when it was sent (issue 28): a record made
            # before then is of an object the store deleted; one made after it (an
            # object made again while the delete's answer was on its way) is kept,
            # never returned for an object that still exists (an over-count at worst,
            # which the next reconcile corrects, never an under-count).
            sent_at = self.ledger.clock()
            response = await call_next(ctx)
            if 200 <= response.status < 300 and not dry:
                await self._after_delete(target, response, sent_at)
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
                Reservation(rid, tenant, namespace, charge, self.ledger.clock()),
                lambda: self.ledger.reserve(
                    tenant, namespace, charge, tenant_limits, ns_limits, rid, claim
                ),
            )
        except QuotaExceeded as exc:
            self._refused(ctx, exc)
            # Dry-run: forward anyway; a 2xx still charges `used` (commit needs no
            # reservation).
            reservation = Reservation(rid, tenant, namespace, charge)
        except ClaimReplay as exc:
            return _replayed(ctx, exc.answer)
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
            await self._release(reservation)
            return await self._checked_only(ctx, call_next)

        named = _name_of(body)
        made = ObjectRef(tenant, namespace, tracked.resource, named) if named else None
        ctx.read_whole_answer = True
        try:
            response = await call_next(ctx)
        except StatusError as exc:
            if isinstance(exc, UpstreamError) and not _never_sent(exc):
                self._unknown(ctx, reservation, made)
            else:  # refused before anything reached the upstream
                await self._release(reservation)
            raise
        except BaseException:
            # The client or the sidecar went away (a cancellation), or the exchange broke:
            # whether the store made it is unknown.
            self._unknown(ctx, reservation, made)
            raise
        if 200 <= response.status < 300:
            raw = _answer(response)
            stored = _parsed(raw)
            name = _name_of(stored) or named or f"unnamed-{reservation.id}"
            final = _object_charge(tracked, stored) or reservation.charge
            answer = Answer(response.status, response.headers.get("Content-Type", ""), raw or b"")
            await self.settler.now_or_later(
                lambda: self.ledger.commit(reservation, name, tracked.resource, final, answer),
                "commit",
            )
        elif response.status >= 500:
            self._unknown(ctx, reservation, made)
        else:
            await self._release(reservation)
        return response

    def _unknown(
        self, ctx: RequestContext, reservation: Reservation, made: ObjectRef | None
    ) -> None:
        """No complete answer: the reservation stays in progress and is settled against
        the store (a create without a name: left to its TTL and the next reconcile)."""
        ctx.audit["quota"] = "unsettled"
        if made is None:
            log.info(
                "request %s: the outcome of a create without a name is unknown; its "
                "reservation is left to expire and the next reconcile",
                ctx.request_id,
            )
            return
        self.settler.settle_create(reservation, made)

    async def _guarded(
        self, reserving: Reservation, reserve: Callable[[], Awaitable[Reservation]]
    ) -> Reservation:
        """Run a reserve so that neither a cancellation (client gone) nor a lost answer
        (the ledger timed out: the reserve may still run) leaks it: what it reserved is
        released, once the ledger answers again."""
        task = asyncio.ensure_future(reserve())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:

            def release_late(t: asyncio.Future[Reservation]) -> None:
                if t.cancelled():
                    return
                exc = t.exception()
                if exc is None or (isinstance(exc, LedgerError) and exc.ambiguous):
                    self.settler.release_later(reserving)

            task.add_done_callback(release_late)
            raise
        except LedgerError as exc:
            if exc.ambiguous:  # it may have run, or run yet: undone once the ledger answers
                self.settler.release_later(reserving)
            raise

    def _refused(self, ctx: RequestContext, exc: QuotaExceeded) -> None:
        """Count a refusal; raise the 403 unless the caller's tenant is in dry-run and
        the quota is its own tenant's (a mode relaxes own-tenant refusals only, §5)."""
        assert ctx.identity is not None and ctx.target is not None
        self.metrics.quota_refusals.labels(self.metrics.tenant(exc.tenant), exc.resource).inc()
        self.gauges.mark(exc.tenant)
        if not (ctx.dry_run and inside_caller_tenant(ctx.identity, ctx.target)):
            ctx.audit["quota"] = "refused"
            raise quota_error(exc) from None
        ctx.audit["quota"] = "would_refuse: " + quota_message(exc)

    async def _release(self, reservation: Reservation) -> None:
        """Release now (the caller waits, shielded from its own cancellation); a ledger
        failure is retried in the background until the reservation would expire."""
        task = asyncio.ensure_future(self.ledger.release(reservation))
        try:
            await asyncio.shield(task)
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("release").inc()
            log.warning("quota release failed (retried): %s", exc.detail)
            self.settler.release_later(reservation)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: self._release_failed(t, reservation))
            raise

    def _release_failed(self, task: asyncio.Future[None], reservation: Reservation) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.settler.release_later(reservation)

    # -- updates and patches ----------------------------------------------------------

    async def _update(
        self,
        ctx: RequestContext,
        call_next: Handler,
        target: RequestTarget,
        tracked: Tracked,
        dry: bool = False,
    ) -> web.StreamResponse:
        """DESIGN §7: the new charge is that of the object the upstream says the update
        would make (the same request as a `dryRun=All`), so every patch type the
        upstream applies is charged exactly as it applies it."""
        assert ctx.identity is not None and target.tenant is not None
        await ctx.read_body()  # any type the upstream takes; the upstream judges it
        tenant, namespace = target.tenant, target.namespace or ""
        obj = ObjectRef(tenant, namespace, tracked.resource, target.name)
        # Claim the object first, then ask the upstream: no other update of it through
        # the sidecar can land between the dry run and this update's commit.
        lock: Reservation | None = None
        ledger_down: LedgerError | None = None
        rid = new_reservation_id()
        try:
            lock = await self._guarded(
                Reservation(rid, tenant, namespace, {}, self.ledger.clock()),
                lambda: self.ledger.reserve(tenant, namespace, {}, {}, {}, rid, object_claim(obj)),
            )
        except ClaimConflict:
            raise StatusError(
                409, f'another update of {tracked.resource} "{target.name}" is in progress; retry'
            ) from None
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("reserve").inc()
            ledger_down = exc
        settled = False
        raw = await ctx.read_body()
        try:
            # The body read once as the upstream reads it: the dry run and the real
            # write send the same bytes but for the precondition (415/400 here, with
            # nothing sent or reserved).
            body = parse_write_body(
                ctx.request.method,
                ctx.request.content_type,
                ctx.request.headers.get("Content-Encoding", ""),
                raw,
            )
            # An earlier stage decided on a state of the object (its owner, read fresh):
            # the dry run is held to that state too, and a change means deciding again.
            pinned = ctx.decided_state
            for attempt in range(1, MAX_ATTEMPTS + 1):
                ctx.body = body.with_state(pinned)
                would = await self.upstream.dry_run(ctx)
                if not 200 <= would.status < 300:
                    if (
                        pinned is not None
                        and would.status in body.changed_statuses
                        and await self._moved(ctx, target, pinned)
                    ):
                        raise StateChanged(409, "the object changed after it was decided on")
                    # Refused by the upstream (not found, invalid, a conflict…): that
                    # answer, and nothing forwarded, nothing reserved.
                    ctx.audit["quota"] = "refused by the upstream's dry run"
                    return _passed_on(ctx, would)
                if not isinstance(would.object, dict):
                    raise UpstreamError(502, "the upstream's dry run did not answer with an object")
                new_charge = _charge(tracked, would.object)
                # The state the dry run was made on: the real write is held to it (to
                # the earlier stage's, when one decided: the dry run was held to it too).
                state = DecidedState.of(would.object)
                if state is None or (
                    pinned is not None and state.resource_version != pinned.resource_version
                ):
                    raise UpstreamError(
                        502, "the upstream's dry run did not answer with the object's version"
                    )
                state = pinned or state
                if lock is None:
                    assert ledger_down is not None
                    ctx.body = body.with_state(state)
                    return await self._unrecorded(
                        ctx, call_next, target, tracked, new_charge, ledger_down
                    )
                quotas = ctx.policy.quotas
                tenant_limits, _ = quotas.tenant_limits(tenant)
                ns_limits = quotas.namespace_limits(tenant, namespace) if namespace else {}
                try:
                    # An object the ledger has not recorded is charged whole (its commit
                    # adds its whole charge to `used`); a recorded one by its increase.
                    # Made again on a later attempt, it replaces the earlier increase.
                    lock = await self.ledger.reserve_change(
                        lock, obj, new_charge, {}, tenant_limits, ns_limits
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
                    return await self._checked_only(ctx, call_next)
                ctx.body = body.with_state(state)
                ctx.read_whole_answer = True
                held = lock
                try:
                    response = await call_next(ctx)
                except StatusError as exc:
                    if isinstance(exc, UpstreamError) and not _never_sent(exc):
                        settled = True
                        ctx.audit["quota"] = "unsettled"
                        self.settler.settle_update(held, obj, new_charge)
                    raise
                except BaseException:
                    settled = True
                    ctx.audit["quota"] = "unsettled"
                    self.settler.settle_update(held, obj, new_charge)
                    raise
                if 200 <= response.status < 300:
                    settled = True
                    final = _object_charge(tracked, _parsed(_answer(response))) or new_charge
                    booked = self._bookable(ctx, obj, final, new_charge)
                    await self.settler.now_or_later(
                        partial(self.ledger.commit_change, held, obj, booked), "commit_change"
                    )
                    return response
                if response.status >= 500:
                    settled = True
                    ctx.audit["quota"] = "unsettled"
                    self.settler.settle_update(held, obj, new_charge)
                    return response
                if response.status not in body.changed_statuses:
                    return response  # refused for another reason: released below
                # The object changed between the dry run and the write, which the
                # upstream refused: decide again on its new state.
                ctx.audit["quota.attempts"] = attempt + 1
                if pinned is not None:
                    raise StateChanged(409, "the object changed after it was decided on")
            ctx.audit["quota"] = "conflict: the object kept changing"
            raise conflict(tracked.resource, target.name, MAX_ATTEMPTS)
        except StateChanged:
            ctx.body = raw  # decided again from the request as it came
            raise
        finally:
            if lock is not None and not settled:
                await self._release(lock)

    async def _moved(
        self, ctx: RequestContext, target: RequestTarget, pinned: DecidedState
    ) -> bool:
        """Whether the object is no longer in the state an earlier stage decided on (a
        dry run held to it refused with 409/422 for that reason, not its own)."""
        try:
            status, now = await self.upstream.get_json(
                target.upstream_path, ctx.identity, request_id=ctx.request_id
            )
        except StatusError:
            return False  # cannot tell: the dry run's own answer stands
        if status not in (200, 404):
            return False  # cannot tell: the dry run's own answer stands
        return DecidedState.of(now if status == 200 else None) != pinned

    def _bookable(
        self, ctx: RequestContext, obj: ObjectRef, final: Charge, reserved: Charge
    ) -> Charge:
        """What a commit books: the stored object's charge, unless it is more than was
        reserved for it (`reserved`: the charge checked against the quota) in any
        resource. That never happens while every write carries its decided state
        (defence in depth): it is logged and counted, the reserved charge is booked,
        and the tenant is reconciled at once, so the ledger shows what the store holds."""
        excess = {r: n - reserved.get(r, 0) for r, n in final.items() if n > reserved.get(r, 0)}
        if not excess:
            return final
        label = self.metrics.tenant(obj.tenant)
        for resource in excess:
            self.metrics.quota_overcommit.labels(label, resource).inc()
        log.error(
            "request %s: the store holds %s %r charged more than was reserved (%s over); "
            "booked as reserved, reconciling tenant %s",
            ctx.request_id,
            obj.resource,
            obj.name,
            ", ".join(f"{r} +{format_units(r, n)}" for r, n in sorted(excess.items())),
            obj.tenant,
        )
        ctx.audit["quota"] = "overcommit refused"
        self.reconciles.request(obj.tenant)
        return {r: min(n, reserved.get(r, 0)) for r, n in final.items() if reserved.get(r, 0)}

    # -- subresource writes -----------------------------------------------------------

    async def _subresource_write(
        self,
        ctx: RequestContext,
        call_next: Handler,
        target: RequestTarget,
        tracked: Tracked,
    ) -> web.StreamResponse:
        """A write to a subresource of a tracked object (`status`, a server's `tags`, any
        other) takes the same per-object claim as an update of the object (409 while
        one is in flight), so it cannot land between a charged update's dry run and
        its write through this ledger; writes that bypass the sidecar are caught by
        that write's precondition. A ledger that cannot be reached claims nothing (the
        charged update is then held by its precondition alone)."""
        assert target.tenant is not None
        tenant, namespace = target.tenant, target.namespace or ""
        obj = ObjectRef(tenant, namespace, tracked.resource, target.name)
        rid = new_reservation_id()
        try:
            lock: Reservation | None = await self._guarded(
                Reservation(rid, tenant, namespace, {}, self.ledger.clock()),
                lambda: self.ledger.reserve(tenant, namespace, {}, {}, {}, rid, object_claim(obj)),
            )
        except ClaimConflict:
            raise StatusError(
                409,
                f'an update of {tracked.resource} "{target.name}" is in progress; retry',
                reason="Conflict",
            ) from None
        except LedgerError as exc:
            self.metrics.ledger_errors.labels("reserve").inc()
            log.warning("quota ledger failed on a subresource claim: %s", exc.detail)
            lock = None
        try:
            return await call_next(ctx)
        finally:
            if lock is not None:
                await self._release(lock)

    async def _unrecorded(
        self,
        ctx: RequestContext,
        call_next: Handler,
        target: RequestTarget,
        tracked: Tracked,
        new_charge: Charge,
        down: LedgerError,
    ) -> web.StreamResponse:
        """The ledger cannot be reached: an update that raises the object's charge (over
        the object as the store has it now) is refused with 503, any other goes through
        unrecorded (reconcile corrects it)."""
        current = await self._fresh(ctx, target, tracked)
        base = _object_charge(tracked, current) or {tracked.resource: 1}
        if any(d > 0 for d in charge_delta(new_charge, base).values()):
            raise ledger_unavailable(
                down, "reserve", f"updates that raise the charge of {tracked.resource} are refused"
            )
        log.warning("quota ledger failed on update: %s", down.detail)
        ctx.audit["quota"] = "unrecorded"
        return await call_next(ctx)

    async def _fresh(
        self, ctx: RequestContext, target: RequestTarget, tracked: Tracked
    ) -> dict[str, Any]:
        """The object as the store has it now (never a cached copy)."""
        status, current = await self.upstream.get_json(
            target.upstream_path, ctx.identity, request_id=ctx.request_id
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

    # -- deletes ------------------------------------------------------------------------

    async def _after_delete(
        self, target: RequestTarget, response: web.StreamResponse, at: float
    ) -> None:
        """Return what a successful delete freed. A ledger that fails (or stalls past its
        timeout) is asked again until it answers; the delete is made at the time it
        happened, so a repeat returns a charge once and never that of an object of the
        same name made since. A deletecollection that deleted something (its answer
        says so: `deleted_something`) has the tenant recounted, one reconcile at a time
        per tenant (`Reconciles`); one that deleted nothing costs nothing. `at`: when
        the delete was sent."""
        call: Callable[[], Awaitable[Any]]
        if target.verb == "delete":
            if target.scope == Scope.CLUSTER and target.resource == "tenants":
                call = partial(self.ledger.delete_scope, target.name, None, at)
            elif target.scope == Scope.TENANT and target.resource == "namespaces" and target.tenant:
                call = partial(self.ledger.delete_scope, target.tenant, target.name, at)
            elif _tracked_item(target) and target.tenant:
                obj = ObjectRef(target.tenant, target.namespace or "", target.resource, target.name)
                call = partial(self.ledger.delete, obj, at)
            else:
                return
            await self.settler.now_or_later(call, "delete")
            self.gauges.mark(target.tenant or target.name)
        elif _tracked_item(target) is not None and target.tenant:
            # A streamed answer (not read whole: large, or of unknown length) is None.
            if deleted_something(_answer(response)):
                self.reconciles.request(target.tenant)

    async def _evicted(
        self, ctx: RequestContext, call_next: Handler, target: RequestTarget
    ) -> web.StreamResponse:
        """An eviction the store accepted deleted the pod: what it was charged returns
        as on a delete (nothing on a dry run, in the query or in `deleteOptions`)."""
        dry = await is_dry_run_all(ctx)
        body = await ctx.read_json() if ctx.request.body_exists else None
        options = body.get("deleteOptions") if isinstance(body, dict) else None
        if isinstance(options, dict) and options.get("dryRun"):
            dry = True
        sent_at = self.ledger.clock()
        response = await call_next(ctx)
        if 200 <= response.status < 300 and not dry:
            pod = dataclasses.replace(target, verb="delete", subresource="", extra=())
            await self._after_delete(pod, response, sent_at)
        return response

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
    assert ctx.target is not None
    dry = ctx.target.param("dryRun")
    values: list[object] = [] if dry is None else [dry]
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


def _is_eviction(target: RequestTarget) -> bool:
    return (
        target.verb == "create"
        and target.api_group == ""
        and target.resource == "pods"
        and target.subresource == "eviction"
        and bool(target.name)
        and not target.extra
    )


def _charge(tracked: Tracked, obj: dict[str, Any]) -> Charge:
    try:
        return charge_for(tracked.resource, obj)
    except QuantityError as exc:
        raise bad_request(f"invalid resource requests: {exc}") from None


def _object_charge(tracked: Tracked, obj: Any) -> Charge | None:
    """The charge of an object the store answered with (None when it cannot tell)."""
    try:
        return charge_for(tracked.resource, obj) if isinstance(obj, dict) else None
    except QuantityError:
        return None


def _answer(response: web.StreamResponse) -> bytes | None:
    """The body of an answer the proxy read whole (`ctx.read_whole_answer`)."""
    body = response.body if isinstance(response, web.Response) else None
    return body if isinstance(body, bytes) else None


def _parsed(raw: bytes | None) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None


def _name_of(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _never_sent(exc: UpstreamError) -> bool:
    """Whether the upstream cannot have acted: its connection could not even be made
    (the proxy's 502 raised from an UpstreamUnreachable)."""
    return isinstance(exc.__context__, UpstreamUnreachable)


def _replayed(ctx: RequestContext, answer: Answer) -> web.Response:
    """The first answer of a create, for a retry with the same `Idempotency-Key`."""
    ctx.audit["quota"] = "replayed"
    ctx.status = answer.status
    response = web.Response(status=answer.status, body=answer.body)
    if answer.content_type:
        response.headers["Content-Type"] = answer.content_type
    response.headers.update(ctx.response_headers)
    response.headers["Idempotency-Replayed"] = "true"
    response.headers["X-Request-Id"] = ctx.request_id
    return response


def _passed_on(ctx: RequestContext, would: DryRunAnswer) -> web.Response:
    """The upstream's refusal of the dry run, as the answer to the request."""
    ctx.status = would.status
    response = web.Response(status=would.status, body=would.body)
    if would.content_type:
        response.headers["Content-Type"] = would.content_type
    response.headers.update(ctx.response_headers)
    response.headers["X-Request-Id"] = ctx.request_id
    return response


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
    assert ctx.target is not None
    return idempotency_claim(
        ctx.identity.tenant, key, ctx.request.method, ctx.target.upstream_target(), ctx.body or b""
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

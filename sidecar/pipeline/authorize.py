"""The authorize stage: tenant isolation and the policy decision for every request.

The decision is `policy.decide.decide`; this stage only does the I/O around it: reads
the stored object's owner when only owner rules could grant an item (fresh for writes,
maybe cached for reads; a missing object is decided like one nobody owns), reads the
body when a write's owner fields must be checked, and then acts on the verdict:
forward (allow), forward with an owner filter (lists: `?owner=`, and the answer
streamed through the filter) or the checked body, or answer the verdict's 403 / 404.
Dry-run mode (global or per tenant, `ctx.dry_run`) decides, logs and counts
`would_deny`, and forwards a refusal the verdict says a mode may relax
(`Verdict.relaxable`: a 403 inside the caller's own tenant, decided in
`policy/decide.py`); everything else is refused in every mode. A forwarded request
always gets what its verdict asks (owner filter, checked body), in every mode. Access
reviews (`sidecar.edge.reviews`) are answered here, after identity and the rate limit, and
never forwarded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError, bad_request
from sidecar.core.target import RequestTarget
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.policy.decide import decide
from sidecar.policy.decision import Verdict
from sidecar.policy.engine import READ_VERBS, DecisionCache
from sidecar.policy.kinds.modes import DRY_RUN, ENFORCE, forwards
from sidecar.policy.owner import (
    APPLY,
    RESULT,
    UPSTREAM_APPLIES,
    GetJson,
    OwnerLookup,
    list_filter,
    patch_kind,
)
from sidecar.services.audit import authz_record
from sidecar.upstream.preconditions import (
    MAX_ATTEMPTS,
    DecidedState,
    StateChanged,
    conflict,
    held_delete_options,
    parse_write_body,
)

if TYPE_CHECKING:
    from sidecar.services.metrics import Metrics

log = logging.getLogger("sidecar.authorize")


class DryRunResult(Protocol):
    """What `Upstream.dry_run` answers, as the authorizer reads it."""

    @property
    def status(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def object(self) -> Any: ...


DryRun = Callable[[RequestContext], Awaitable[DryRunResult]]


def _upstream_message(status: int, body: bytes) -> str:
    """The message of the upstream's refusal of a dry run (a Status body), or a plain
    one; never more than a line of it."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    if isinstance(message, str) and message:
        return message[:500]
    return f"the upstream refused this write ({status})"


class Authorize(Protocol):
    """`Authorizer.authorize`: the one decision function with its I/O, as the stages
    that decide again (impersonation, open watches) are given it."""

    async def __call__(
        self,
        ctx: RequestContext,
        identity: Identity,
        target: RequestTarget,
        *,
        read_body: bool = ...,
        fetch_as: Identity | None = ...,
    ) -> Verdict: ...


class Reviews(Protocol):
    """The access reviews (`sidecar.edge.reviews.ReviewApi`), answered by this stage."""

    def handles(self, target: RequestTarget) -> bool: ...

    async def answer(self, ctx: RequestContext, authz: Authorizer) -> web.StreamResponse: ...


class Authorizer:
    """`decide` with the I/O it needs: the decision cache and the owner lookup. Shared
    by the authorize stage, the access reviews and the quota API."""

    def __init__(
        self,
        cache: DecisionCache,
        owners: OwnerLookup,
        get_json: GetJson,
        *,
        conceal: bool,
        dry_run: DryRun | None = None,
    ) -> None:
        self.cache = cache
        self.owners = owners
        self.get_json = get_json
        self.conceal = conceal
        self.dry_run = dry_run

    async def authorize(
        self,
        ctx: RequestContext,
        identity: Identity,
        target: RequestTarget,
        *,
        read_body: bool = True,
        fetch_as: Identity | None = None,
    ) -> Verdict:
        """The verdict, with what it depends on read: the stored owner when only owner
        rules could grant an item (fresh for writes; `fetch_as`: whose credentials read
        it, the caller's by default; 503 when it cannot be read), then, with
        `read_body`, the body a write's owner rule must check (415/400/413 for a body
        that cannot be read as JSON, as for every body the sidecar reads)."""
        bundle, conceal, cache = ctx.policy, self.conceal, self.cache
        v = decide(bundle, identity, target, conceal=conceal, cache=cache)
        obj: Any = None
        if v.needs_object and v.target is not None:
            obj = await self.owners.fetch(
                self.get_json,
                fetch_as or identity,
                v.target,
                ctx.request_id,
                # Fresh for reads too: a read answers with the store's object as it is
                # now, so an owner cached from before a reassignment would show the
                # new owner's object to the old one (hostile review, issue 28).
                fresh=True,
            )
            _pin(ctx, v.target, obj)
            obj = obj or {}
            v = decide(bundle, identity, target, obj, conceal=conceal, cache=cache)
        patch = patch_kind(ctx.request.method, ctx.request.content_type)
        # An apply of an object that does not exist creates it: `create` is decided too,
        # as the Kubernetes API server does (a `patch` grant alone creates nothing).
        stored: Any = obj or None
        if patch == APPLY and v.target is not None and v.target.name and not v.target.subresource:
            if stored is None:
                stored = await self.owners.fetch(
                    self.get_json, fetch_as or identity, v.target, ctx.request_id, fresh=True
                )
                _pin(ctx, v.target, stored)
            if stored is None and (v.allowed or v.relaxable):
                create = dataclasses.replace(target, verb="create")
                created = decide(bundle, identity, create, conceal=conceal, cache=cache)
                if not created.allowed:
                    return created
        # A relaxable refusal's body is read only when the mode will relax it.
        if v.needs_body and read_body and (v.allowed or (v.relaxable and ctx.dry_run)):
            if patch in UPSTREAM_APPLIES:
                # Strategic merge and server-side apply: only the upstream knows what
                # the object becomes (DESIGN §7), so the owner rule reads its dry run,
                # against the stored object (None: the write creates it).
                doc = await self._would_become(ctx, fetch_as or identity, v.target)
                if stored is None and patch != APPLY and v.target is not None:
                    stored = await self.owners.fetch(
                        self.get_json, fetch_as or identity, v.target, ctx.request_id, fresh=True
                    )
                    _pin(ctx, v.target, stored)
                obj, patch = stored, RESULT
            else:
                doc = await ctx.read_json()
            v = decide(
                bundle, identity, target, obj, doc, conceal=conceal, patch=patch, cache=cache
            )
        return v

    async def moved(
        self,
        ctx: RequestContext,
        identity: Identity,
        target: RequestTarget | None,
        pinned: DecidedState,
    ) -> bool:
        """Whether the object is no longer in the state a write was decided on (read
        fresh): a write held to that state and refused with 409/422 was refused for
        that (decide again), or else for its own reasons (its answer stands)."""
        if target is None:
            return False
        try:
            now = await self.owners.fetch(
                self.get_json, identity, target, ctx.request_id, fresh=True
            )
        except StatusError:
            return False  # cannot tell: the refusal stands
        return DecidedState.of(now) != pinned

    async def _would_become(
        self, ctx: RequestContext, identity: Identity, target: RequestTarget | None
    ) -> Any:
        """The object the upstream's dry run of this write answers; its refusal (not
        found, invalid, a conflict) is the answer to the request."""
        if self.dry_run is None:
            raise StatusError(415, "this patch type cannot be checked here; send a merge patch")
        pinned = ctx.decided_state
        raw = await ctx.read_body()
        held = _held_body(ctx, raw, pinned)
        ctx.body = held
        try:
            answer = await self.dry_run(ctx)
        finally:
            ctx.body = raw
        if not 200 <= answer.status < 300:
            if (
                pinned is not None
                and answer.status in (409, 422)
                and await self.moved(ctx, identity, target, pinned)
            ):
                raise StateChanged(409, "the object changed after its owner was read")
            raise StatusError(answer.status, _upstream_message(answer.status, answer.body))
        if pinned is None and answer.status == 201:
            # An apply that creates: the real write is held to "not there yet" by the
            # dry run's uid (an object made in between has another).
            ctx.decided_state = DecidedState.of(answer.object)
        return answer.object


class AuthorizeStage:
    name = "authorize"

    def __init__(
        self, authorizer: Authorizer, metrics: Metrics, reviews: Reviews | None = None
    ) -> None:
        self.authz = authorizer
        self.metrics = metrics
        self.reviews = reviews

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        identity, target = ctx.authenticated(), ctx.target
        if target is None:
            raise bad_request("the request target could not be parsed")
        if self.reviews is not None and self.reviews.handles(target):
            return await self.reviews.answer(ctx, self.authz)
        # A write decided on the object's owner (read fresh) is sent holding the state it
        # was read in (upstream/preconditions.py); when the object changed before the
        # write landed, it is decided again on its new state, a bounded number of times.
        body: list[tuple[bytes | None, Any]] = []
        for _attempt in range(MAX_ATTEMPTS):
            if body:
                ctx.body, ctx.parsed_body = body[0]
            ctx.decided_state = None
            try:
                return await self._decided(ctx, identity, target, call_next, body)
            except StateChanged:
                ctx.audit["authz.attempts"] = _attempt + 2
                if not body:  # nothing read yet that could be restored
                    body.append((ctx.body, ctx.parsed_body))
        raise conflict(target.resource, target.name, MAX_ATTEMPTS)

    async def _decided(
        self,
        ctx: RequestContext,
        identity: Identity,
        target: RequestTarget,
        call_next: Handler,
        body: list[tuple[bytes | None, Any]],
    ) -> web.StreamResponse:
        v = await self.authz.authorize(ctx, identity, target)
        ctx.decision = v
        ctx.audit["authz"] = authz_record(v)
        label = self.metrics.tenant(identity.tenant)
        if not v.allowed and forwarded(v, ctx.dry_run):
            self.metrics.child(self.metrics.decisions, label, "would_deny").inc()
            ctx.audit["authz"]["mode"] = "dry-run"
            log.info(
                "dry-run: would answer %d to %s %s for %s@%s: %s",
                v.status,
                target.verb,
                target.path,
                identity.user,
                identity.tenant,
                v.reason,
            )
            return await self._forward(ctx, identity, v, call_next, body)
        self.metrics.child(self.metrics.decisions, label, v.outcome).inc()
        if not v.allowed:
            if ctx.dry_run:
                ctx.audit["authz"]["mode"] = "dry-run (not relaxed)"
            raise v.refusal()
        return await self._forward(ctx, identity, v, call_next, body)

    async def _forward(
        self,
        ctx: RequestContext,
        identity: Identity,
        v: Verdict,
        call_next: Handler,
        body: list[tuple[bytes | None, Any]] | None = None,
    ) -> web.StreamResponse:
        pinned = ctx.decided_state
        if pinned is not None and body is not None and not body:
            # Held to the state it was decided on, so read now (only once forwarded:
            # a `100 Continue` waits for the decision), and kept as read for a
            # decision made again.
            await ctx.read_body()
            body.append((ctx.body, ctx.parsed_body))
        self._apply(ctx, identity, v)
        try:
            if pinned is None:
                return await call_next(ctx)
            ctx.body = _held_body(ctx, await ctx.read_body(), pinned)
            ctx.read_whole_answer = True  # not sent before its status is judged
            response = await call_next(ctx)
            if response.status in (409, 422) and await self.authz.moved(
                ctx, identity, v.target, pinned
            ):
                raise StateChanged(409, "the object changed after its owner was read")
            return response
        finally:
            self._forget_written(ctx, identity, v)

    def _apply(self, ctx: RequestContext, identity: Identity, v: Verdict) -> None:
        """What the verdict asks of the forwarded request, in every mode."""
        if v.owner.list_field:
            # Forwarded with `?owner=` (and, for a Table, `includeObject=Object`), the
            # answer streamed through the filter (sidecar/services/listfilter.py).
            target = v.target or ctx.target
            flt = list_filter(
                identity.tenant,
                v.owner.list_field,
                ctx.request.headers.get("Accept", ""),
                target.param("includeObject") if target is not None else None,
            )
            ctx.upstream_query.extend(flt.upstream_query)
            ctx.owner_list = flt
        if v.body is not None:
            ctx.body = json.dumps(v.body).encode()
            ctx.parsed_body = v.body
        t = v.target
        if v.needs_object and t is not None and t.verb not in READ_VERBS:
            # The write may change the owner: later reads must not use a stale one.
            self.authz.owners.forget(identity, t)

    def _forget_written(self, ctx: RequestContext, identity: Identity, v: Verdict) -> None:
        """After a write: what the caller's reads cached of the object (its owner, or
        that it was missing) is forgotten, so the caller reads its own write (a read
        between `_apply`'s forget and the write's end may have cached the old state)."""
        t = v.target
        if t is None or t.verb in READ_VERBS:
            return
        if t.name:
            if v.needs_object:
                self.authz.owners.forget(identity, t)
            return
        if t.verb == "create":
            # A create names its object in the body; only a body the sidecar read
            # (an owner-checked create) can name one the owner cache may hold.
            body = v.body if v.body is not None else ctx.parsed_body
            meta = body.get("metadata") if isinstance(body, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if isinstance(name, str) and name:
                self.authz.owners.forget(identity, dataclasses.replace(t, name=name))


def forwarded(v: Verdict, dry_run: bool) -> bool:
    """Whether a request with this verdict is forwarded (`modes.forwards`; open watches
    are decided again by the same rule)."""
    return forwards(v, DRY_RUN if dry_run else ENFORCE)


# Writes decided on a fresh read of their object: the write holds that read's state.
# An update or patch of the object or of a subresource that takes the object's
# `metadata` as a precondition (Kubernetes' status and scale, the reference store's
# node power), and a delete (DeleteOptions `preconditions`).
_HELD_VERBS = frozenset({"update", "patch"})
_HELD_SUBRESOURCES = frozenset({"", "status", "scale", "power"})


def _pin(ctx: RequestContext, target: RequestTarget, obj: Any) -> None:
    """Remember the state of the object a write of it was decided on (a fresh read;
    None when missing: the write creates it or finds nothing)."""
    if not target.name or target.extra:
        return
    held = (target.verb in _HELD_VERBS and target.subresource in _HELD_SUBRESOURCES) or (
        target.verb == "delete" and not target.subresource
    )
    if held:
        ctx.decided_state = DecidedState.of(obj) if obj else None


def _held_body(ctx: RequestContext, raw: bytes, state: DecidedState | None) -> bytes:
    """The request's body holding `state` as its precondition (unchanged for None)."""
    if state is None:
        return raw
    request = ctx.request
    if request.method == "DELETE":
        return held_delete_options(raw, state)
    return parse_write_body(
        request.method, request.content_type, request.headers.get("Content-Encoding", ""), raw
    ).with_state(state)

"""The authorize stage: tenant isolation and the policy decision for every request.

The decision is `policy.decide.decide`; this stage only does the I/O around it: reads
the stored object's owner when only owner rules could grant an item (fresh for writes,
maybe cached for reads; a missing object is decided like one nobody owns), reads the
body when a write's owner fields must be checked, and then acts on the verdict:
forward (allow), forward with an owner filter (`?owner=` plus a response filter for
lists) or the checked body, or answer the verdict's 403 / 404. Dry-run mode (global or
per tenant, `ctx.dry_run`) decides, logs and counts `would_deny`, and forwards anyway,
except across tenants: a request that isolation refuses is refused in dry-run too.
Access reviews (`sidecar.reviews`) are answered here, after identity and the rate
limit, and never forwarded.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from sidecar.context import Identity, RequestContext
from sidecar.errors import bad_request, unauthorized
from sidecar.pipeline import Handler
from sidecar.policy.decide import decide
from sidecar.policy.decision import Verdict
from sidecar.policy.engine import READ_VERBS, DecisionCache
from sidecar.policy.owner import GetJson, OwnerLookup, list_filter, patch_kind
from sidecar.target import RequestTarget

if TYPE_CHECKING:
    from sidecar.metrics import Metrics

log = logging.getLogger("sidecar.authorize")


class Reviews(Protocol):
    """The access reviews (`sidecar.reviews.ReviewApi`), answered by this stage."""

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
    ) -> None:
        self.cache = cache
        self.owners = owners
        self.get_json = get_json
        self.conceal = conceal

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
                fresh=v.target.verb not in READ_VERBS,
            )
            obj = obj or {}
            v = decide(bundle, identity, target, obj, conceal=conceal, cache=cache)
        if v.allowed and v.needs_body and read_body:
            doc = await ctx.read_json()
            patch = patch_kind(ctx.request.method, ctx.request.content_type)
            v = decide(
                bundle, identity, target, obj, doc, conceal=conceal, patch=patch, cache=cache
            )
        return v


class AuthorizeStage:
    name = "authorize"

    def __init__(
        self, authorizer: Authorizer, metrics: Metrics, reviews: Reviews | None = None
    ) -> None:
        self.authz = authorizer
        self.metrics = metrics
        self.reviews = reviews

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        identity, target = ctx.identity, ctx.target
        if identity is None:
            raise unauthorized("authentication required")
        if target is None:
            raise bad_request("the request target could not be parsed")
        if self.reviews is not None and self.reviews.handles(target):
            return await self.reviews.answer(ctx, self.authz)
        v = await self.authz.authorize(ctx, identity, target)
        ctx.decision = v
        ctx.audit["authz"] = audit_record(v)
        label = self.metrics.tenant(identity.tenant)
        # Isolation holds in dry-run too: a tenant's dry-run never opens another tenant.
        if not v.allowed and ctx.dry_run and not v.isolated:
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
            return await call_next(ctx)
        self.metrics.child(self.metrics.decisions, label, v.outcome).inc()
        if not v.allowed:
            raise v.refusal()
        if not ctx.dry_run:
            self._apply(ctx, identity, v)
        return await call_next(ctx)

    def _apply(self, ctx: RequestContext, identity: Identity, v: Verdict) -> None:
        """What an allowed verdict asks of the forwarded request."""
        if v.owner.list_field:
            ctx.upstream_query.append(("owner", identity.tenant))
            ctx.response_filter = list_filter(identity.tenant, v.owner.list_field)
        if v.body is not None:
            ctx.body = json.dumps(v.body).encode()
            ctx.parsed_body = v.body
        t = v.target
        if v.needs_object and t is not None and t.verb not in READ_VERBS:
            # The write may change the owner: later reads must not use a stale one.
            self.authz.owners.forget(identity, t)


def audit_record(v: Verdict) -> dict[str, Any]:
    record: dict[str, Any] = {
        "decision": v.outcome,
        "reason": v.reason,
        "rule": v.rule_id,
        "revision": v.revision,
    }
    if v.isolated:
        record["isolation"] = "concealed" if v.status == 404 else "forbidden"
    return record

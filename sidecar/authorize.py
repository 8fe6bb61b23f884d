"""The authorize stage: the policy decision for every resource and non-resource request.

Owns turning a `Decision` into what happens to the request: forward (allow), forward
with an owner filter (`?owner=` plus a response filter for lists), 403 Forbidden
naming user/verb/resource, or 404 for cluster-scoped targets and for owner-only items
the caller does not own (or that do not exist: the same answer). Owner-rule items are
decided after the sidecar reads the stored object's owner (`owner.py`; fresh for
writes). A write of an object that carries an owner field, allowed by anything but a
cluster-wide grant, must leave the owner the caller's tenant (set when empty).
Dry-run mode (global or per tenant) decides, logs and counts `would_deny`, and
forwards anyway. Access reviews (`selfsubjectaccessreviews`, `subjectaccessreviews`)
are answered here and never forwarded.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from sidecar.context import Identity, RequestContext
from sidecar.errors import StatusError, bad_request, forbidden, not_found, unauthorized
from sidecar.pipeline import Handler, Stage
from sidecar.policy.decision import Decision
from sidecar.policy.engine import READ_VERBS, DecisionCache, Match, PolicyEngine
from sidecar.policy.modes import DRY_RUN, mode_for
from sidecar.policy.owner import OwnerLookup, enforce_owner, list_filter, patch_kind
from sidecar.runtime import Runtime
from sidecar.target import SYSTEM_TENANT, RequestTarget, Scope, is_dns1123_label

log = logging.getLogger("sidecar.authorize")

REVIEW_GROUP = "authorization.k8s.io"
SELF_REVIEW = "selfsubjectaccessreviews"
SUBJECT_REVIEW = "subjectaccessreviews"
_REVIEW_KINDS = {SELF_REVIEW: "SelfSubjectAccessReview", SUBJECT_REVIEW: "SubjectAccessReview"}


class Authorizer:
    """Decisions with owner handling; shared by the stage and the access reviews."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.cache = DecisionCache(rt.config.cache.decisions, rt.metrics)
        self.owners = OwnerLookup(rt.config.cache.owners, rt.config.cache.owner_ttl_seconds)

    async def decide(
        self,
        engine: PolicyEngine,
        identity: Identity,
        target: RequestTarget,
        request_id: str = "",
        fetch_as: Identity | None = None,
    ) -> tuple[Decision, Match]:
        """The decision, and what the policy granted. Reads the stored owner when only
        owner rules could grant an item: fresh for writes, maybe cached for reads; a
        missing object is decided as one nobody owns (the same answer); 503 if the
        upstream fails."""
        match = self.cache.match(engine, identity, target)
        if not (match.owner_only and target.name and target.verb != "create"):
            return engine.finish(match, identity, target), match
        obj = await self.owners.fetch(
            self.rt.upstream.get_json,
            fetch_as or identity,
            target,
            request_id,
            fresh=target.verb not in READ_VERBS,
        )
        return self.cache.finish(engine, match, identity, target, obj or {}), match


class AuthorizeStage:
    name = "authorize"

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.authz = Authorizer(rt)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        identity, target = ctx.identity, ctx.target
        if identity is None:
            raise unauthorized("authentication required")
        if target is None:
            raise bad_request("the request target could not be parsed")
        if target.resource_request:
            target = target.resolve_tenant(identity.tenant)
        engine = ctx.policy.engine
        if _is_review(target):
            return await self._review(ctx, engine, identity, target)
        mode = mode_for(self.rt.config.mode, ctx.policy.tenant_modes, identity.tenant)
        dry_run = mode == DRY_RUN
        decision, match = await self.authz.decide(engine, identity, target, ctx.request_id)
        refusal: StatusError | None = None
        if not decision.allowed:
            refusal = self._refusal(identity, target, decision)
        else:
            try:
                await self._apply_owner_rules(
                    ctx, engine, match, identity, target, decision, dry_run
                )
            except StatusError as exc:
                if exc.code != 403:
                    raise
                refusal = exc
                decision = Decision(
                    "deny", exc.message, decision.revision, decision.owner_field, decision.rule_id
                )
            if match.owner_only and target.name and target.verb not in READ_VERBS:
                self.authz.owners.forget(identity, target)
        ctx.decision = decision
        ctx.audit["authz"] = {
            "decision": decision.outcome,
            "reason": decision.reason,
            "rule": decision.rule_id,
            "revision": decision.revision,
        }
        metrics = self.rt.metrics
        label = metrics.tenant(identity.tenant)
        if refusal is not None and dry_run:
            metrics.child(metrics.decisions, label, "would_deny").inc()
            ctx.audit["authz"]["mode"] = DRY_RUN
            log.info(
                "dry-run: would deny %s %s for %s@%s: %s",
                target.verb,
                target.path,
                identity.user,
                identity.tenant,
                decision.reason,
            )
            return await call_next(ctx)
        metrics.child(metrics.decisions, label, decision.outcome).inc()
        if refusal is not None:
            raise refusal
        return await call_next(ctx)

    def _refusal(
        self, identity: Identity, target: RequestTarget, decision: Decision
    ) -> StatusError:
        if decision.outcome == "notfound":
            return not_found(target.resource, target.name)
        if (
            target.resource_request
            and target.scope == Scope.CLUSTER
            and identity.tenant != SYSTEM_TENANT
            and self.rt.config.conceal_other_tenants
        ):
            return not_found(target.full_resource, target.name)
        return forbidden(forbidden_message(identity, target))

    async def _apply_owner_rules(
        self,
        ctx: RequestContext,
        engine: PolicyEngine,
        match: Match,
        identity: Identity,
        target: RequestTarget,
        decision: Decision,
        dry_run: bool,
    ) -> None:
        """An allowed request: owner-filter a list granted by owner rules only; keep the
        owner of a written object to the caller's tenant unless a cluster-wide grant
        allows it (`engine.owner_checks`, `owner.enforce_owner`). The checked body is
        what is forwarded, so the upstream parses exactly what was checked."""
        tenant = identity.tenant
        if decision.outcome == "filter" and target.verb == "list":
            if not dry_run:
                ctx.upstream_query.append(("owner", tenant))
                ctx.response_filter = list_filter(tenant, decision.owner_field)
            return
        fields = engine.owner_checks(match, identity, target)
        if not fields:
            return
        doc = await ctx.read_json()
        checked = enforce_owner(
            doc,
            tenant,
            fields,
            target.verb,
            patch_kind(ctx.request.method, ctx.request.content_type),
        )
        if not dry_run:
            ctx.body = json.dumps(checked).encode()
            ctx.parsed_body = checked

    async def _review(
        self,
        ctx: RequestContext,
        engine: PolicyEngine,
        identity: Identity,
        target: RequestTarget,
    ) -> web.StreamResponse:
        kind = _REVIEW_KINDS[target.resource]
        tenant = target.tenant or identity.tenant
        if target.resource == SUBJECT_REVIEW:
            own, _ = await self.authz.decide(engine, identity, target, ctx.request_id)
            self.rt.metrics.decisions.labels(
                tenant=self.rt.metrics.tenant(identity.tenant), outcome=own.outcome
            ).inc()
            ctx.decision = own
            if not own.allowed:
                raise forbidden(forbidden_message(identity, target))
        else:
            ctx.decision = Decision("allow", "anyone may review their own access", engine.revision)
        body = await ctx.read_json()
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise bad_request(f"a {kind} needs a 'spec' object")
        subject = identity
        if target.resource == SUBJECT_REVIEW:
            subject = _review_subject(spec, tenant)
        asked = review_target(spec, tenant)
        decision, _ = await self.authz.decide(
            engine, subject, asked, ctx.request_id, fetch_as=identity
        )
        status: dict[str, Any] = {"allowed": decision.allowed, "reason": decision.reason}
        if not decision.allowed:
            status["denied"] = True
        ctx.audit["authz"] = {
            "decision": "allow",
            "review": decision.outcome,
            "reason": decision.reason,
            "revision": decision.revision,
        }
        answer = {
            "kind": kind,
            "apiVersion": f"{REVIEW_GROUP}/{target.api_version or 'v1'}",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        return web.json_response(answer, status=201, headers=ctx.response_headers)


def forbidden_message(identity: Identity, target: RequestTarget) -> str:
    user = f'User "{identity.user}" of tenant "{identity.tenant}"'
    if not target.resource_request:
        return f'forbidden: {user} cannot {target.verb} path "{target.path}"'
    what = f'{target.full_resource} "{target.name}"' if target.name else target.full_resource
    where = ""
    if target.namespace:
        where = f' in the namespace "{target.namespace}" of tenant "{target.tenant}"'
    elif target.scope == Scope.TENANT:
        where = f' in tenant "{target.tenant}"'
    elif target.scope == Scope.CLUSTER:
        where = " at the cluster scope"
    return (
        f"{what} is forbidden: {user} cannot {target.verb} resource "
        f'"{target.full_resource}" in API group "{target.api_group}"{where}'
    )


def _is_review(target: RequestTarget) -> bool:
    return (
        target.resource_request
        and target.api_group == REVIEW_GROUP
        and target.resource in _REVIEW_KINDS
        and target.scope == Scope.TENANT
        and not target.name
        and target.verb == "create"
    )


def _str(d: dict[str, Any], key: str, *, required: bool = False) -> str:
    value = d.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise bad_request(f"{key!r} must be a string")
    if required and not value:
        raise bad_request(f"{key!r} is required")
    return value


def _review_subject(spec: dict[str, Any], tenant: str) -> Identity:
    user = _str(spec, "user", required=True)
    groups = spec.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise bad_request("'groups' must be a list of strings")
    return Identity(user, tenant, tuple(groups), "subjectaccessreview")


def review_target(spec: dict[str, Any], tenant: str) -> RequestTarget:
    """The target an access review asks about. `resourceAttributes` follow Kubernetes;
    the tenant is the review's own; without a namespace the scope is the tenant, and
    the extension `scope: cluster` asks about cluster-scoped resources."""
    res_attrs, url_attrs = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if (res_attrs is None) == (url_attrs is None):
        raise bad_request("spec needs exactly one of resourceAttributes, nonResourceAttributes")
    if url_attrs is not None:
        if not isinstance(url_attrs, dict):
            raise bad_request("nonResourceAttributes must be an object")
        path = _str(url_attrs, "path", required=True)
        return RequestTarget(
            path=path, verb=_str(url_attrs, "verb", required=True).lower(), resource_request=False
        )
    if not isinstance(res_attrs, dict):
        raise bad_request("resourceAttributes must be an object")
    verb = _str(res_attrs, "verb", required=True)
    resource = _str(res_attrs, "resource", required=True)
    namespace = _str(res_attrs, "namespace")
    scope_name = _str(res_attrs, "scope")
    if "/" in resource:
        raise bad_request("'resource' must not contain '/'; use 'subresource'")
    if namespace and not is_dns1123_label(namespace):
        raise bad_request(f"namespace {namespace!r} is not a valid namespace name")
    if scope_name not in ("", "cluster", "tenant", "namespace"):
        raise bad_request("'scope' must be cluster, tenant or namespace")
    scope = Scope.NAMESPACE if namespace else Scope.TENANT
    if scope_name == "cluster":
        scope, namespace = Scope.CLUSTER, ""
    return RequestTarget(
        path="",
        verb=verb,
        resource_request=True,
        api_group=_str(res_attrs, "group"),
        api_version=_str(res_attrs, "version") or "v1",
        scope=scope,
        tenant=None if scope == Scope.CLUSTER else tenant,
        namespace=namespace or None,
        resource=resource,
        subresource=_str(res_attrs, "subresource"),
        name=_str(res_attrs, "name"),
    )


def make_stage(rt: Runtime) -> Stage:
    return AuthorizeStage(rt)

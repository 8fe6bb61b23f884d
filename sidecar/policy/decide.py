"""The one decision function (DESIGN §5 "Decisions").

`decide(bundle, identity, target, obj, body)` → `Verdict`: allow / filter (forwarded),
deny (403) or notfound (404), with the reason, the binding → role → rule that allowed
it, and what owner rules still ask of the request. Tenant isolation is part of it
(`sidecar.policy.isolation` is the one rule for 404 versus 403). It is pure: it reads
nothing but its arguments (and the optional `DecisionCache` of policy matches).

Everything that decides calls it: the authorize stage (which only does the I/O around
it: reads the stored owner when `needs_object`, the body when `needs_body`, and calls
again), `sidecar policy explain` and `policy test`, the access reviews
(`sidecar/edge/reviews.py`) and the quota API.

Built-in grants, in force whatever the policy: anyone may review their own access
(`selfsubjectaccessreviews`, `selfsubjectrulesreviews`, `selfsubjectreviews`), and a
tenant's users may read its own quota (DESIGN §7).

Which refusals a mode may relax is decided here too, once (`_mode_rule`): a mode
(dry-run, global or per tenant) relaxes only a 403 of a request inside the caller's own
tenant (`isolation.inside_caller_tenant`). Isolation, concealment (every 404), the
cluster level, non-resource URLs, access reviews, impersonation and the owner-field
rule on writes hold in every mode (`Verdict.held` says which); a relaxed write still
has its body's owner fields checked (`Verdict.body`), so a mode never sets another
tenant as owner.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError, forbidden, forbidden_message, not_found
from sidecar.core.target import RequestTarget, Scope, is_dns1123_label
from sidecar.policy.decision import NO_OWNER_CONSTRAINTS, OwnerConstraints, Verdict
from sidecar.policy.engine import DecisionCache, Grant, Match, PolicyEngine
from sidecar.policy.isolation import (
    QUOTA_GROUP,
    inside_caller_tenant,
    outside_caller_tenant,
    refusal,
)
from sidecar.policy.owner import PatchKind, enforce_owner, owner_value
from sidecar.policy.rbac import owner_rule_decides
from sidecar.policy.scopes import TENANT_OBJECTS, is_cluster_scoped

if TYPE_CHECKING:
    from sidecar.policy.source.bundle import PolicyBundle

NO_BODY: Any = object()

# Writes whose body says who owns the object (subresource bodies are not the object).
_OWNER_BODY_VERBS = frozenset({"create", "update", "patch"})

AUTHORIZATION_GROUP = "authorization.k8s.io"
AUTHENTICATION_GROUP = "authentication.k8s.io"
SELF_REVIEWS = frozenset(
    {
        (AUTHORIZATION_GROUP, "selfsubjectaccessreviews"),
        (AUTHORIZATION_GROUP, "selfsubjectrulesreviews"),
        (AUTHENTICATION_GROUP, "selfsubjectreviews"),
    }
)
# Every review the sidecar answers itself (`sidecar/edge/reviews.py`).
REVIEWS = SELF_REVIEWS | {(AUTHORIZATION_GROUP, "subjectaccessreviews")}


def decide(
    bundle: PolicyBundle | PolicyEngine,
    identity: Identity,
    target: RequestTarget,
    obj: Any = None,
    body: Any = NO_BODY,
    *,
    conceal: bool = True,
    patch: PatchKind = "",
    cache: DecisionCache | None = None,
) -> Verdict:
    """The verdict for one request.

    `obj`: the stored object, for an item only owner rules could grant (None: missing
    or unknown, decided like an object the caller does not own). `body`: the parsed
    request body, for a write whose owner fields must be checked (`patch`: "" for a
    whole object, "merge" or "json"; `owner.RESULT` for the object a patch only the
    upstream applies would make, from its dry run, with `obj` the stored one); a body
    of the wrong JSON type raises a 400 `StatusError` (bad input, not a decision).
    `conceal`: `concealOtherTenants`."""
    engine = bundle if isinstance(bundle, PolicyEngine) else bundle.engine
    target = normalize(target, identity)
    builtin = _builtin_grant(identity, target)
    if builtin:
        rev = engine.revision
        return Verdict("allow", f"allowed: {builtin}", rev, target, explanation=builtin)
    m = (
        cache.match(engine, identity, target)
        if cache is not None
        else engine.match(identity, target)
    )
    verdict = _decide(engine, cache, m, identity, target, obj, body, conceal, patch)
    if verdict.allowed:
        return verdict
    return _mode_rule(engine, verdict, m, identity, target, body, patch, obj)


def _decide(
    engine: PolicyEngine,
    cache: DecisionCache | None,
    m: Match,
    identity: Identity,
    target: RequestTarget,
    obj: Any,
    body: Any,
    conceal: bool,
    patch: PatchKind,
) -> Verdict:
    """The verdict without the mode rule (`decide`, on a normalized target)."""
    rev = engine.revision
    if m.invalid:
        held = "an invalid caller or target is refused in every mode"
        return Verdict("deny", m.invalid, rev, target, held=held, error=forbidden(m.invalid))
    if m.unconditional is None and not m.owner and outside_caller_tenant(identity, target):
        reach = (
            cache.can_reach(engine, identity, target)
            if cache is not None
            else engine.can_reach(identity, target)
        )
        if not reach:
            return _isolated(rev, identity, target, conceal)
    if m.unconditional is not None:
        g = m.unconditional
        verdict = Verdict("allow", f"allowed by {g.explain()}", rev, target, g.explain(), g.rule_id)
    elif m.owner:
        verdict = _owner_rules(rev, m, identity, target, obj, conceal)
    else:
        return _refused(rev, identity, target, conceal)
    if not verdict.allowed:
        return verdict
    return _owner_constraints(engine, cache, verdict, m, identity, target, body, patch, obj)


def normalize(target: RequestTarget, identity: Identity) -> RequestTarget:
    """The target as decided (and forwarded): a short path in the caller's tenant
    (`default` for the system tenant); a tenant user's list or watch of a resource
    stored under tenants at the cluster level (`kubectl get -A`) in its own tenant
    (DESIGN §3; `system` callers keep the all-tenants meaning); and a cluster-scoped
    object that stands for a tenant (its Tenant object, its quota) inside that tenant."""
    if not target.resource_request:
        return target
    target = target.resolve_tenant(identity.tenant)
    if (
        target.scope == Scope.CLUSTER
        and not identity.is_operator
        and target.verb in ("list", "watch")
        and (target.name_from_selector or not target.name)
        and not target.subresource
        and not is_cluster_scoped(target.api_group, target.resource)
        and (target.api_group, target.resource) not in TENANT_OBJECTS
    ):
        return target.within_tenant(identity.tenant)
    if (
        target.scope == Scope.CLUSTER
        and target.tenant is None
        and target.name
        and (target.api_group, target.resource) in TENANT_OBJECTS
        and is_dns1123_label(target.name)
    ):
        target = dataclasses.replace(target, tenant=target.name)
    return target


def _builtin_grant(identity: Identity, target: RequestTarget) -> str:
    if not target.resource_request or target.subresource:
        return ""
    key = (target.api_group, target.resource)
    if key in SELF_REVIEWS and target.verb == "create" and not target.name:
        return "anyone may review their own access"
    if key == (QUOTA_GROUP, "quotas") and target.verb == "get" and target.tenant == identity.tenant:
        return "a tenant's users may read its own quota and usage"
    return ""


def _isolated(rev: str, identity: Identity, target: RequestTarget, conceal: bool) -> Verdict:
    where = f"tenant {target.tenant!r}" if target.tenant is not None else "the cluster level"
    reason = (
        f"isolation: {where} is outside the caller's tenant {identity.tenant!r} "
        "and no binding in force reaches it"
    )
    error = refusal(identity, target, conceal=conceal, isolated=True)
    return Verdict(_outcome(error), reason, rev, target, isolated=True, error=error)


def _refused(
    rev: str,
    identity: Identity,
    target: RequestTarget,
    conceal: bool,
    why: str = "no binding in force grants it",
    owner_field: str = "spec.owner",
) -> Verdict:
    error = refusal(identity, target, conceal=conceal, isolated=False)
    reason = f"{forbidden_message(identity.user, identity.tenant, target)}: {why}"
    if error.code == 404:
        reason += " (answered 404: concealed from tenant users)"
    return Verdict(_outcome(error), reason, rev, target, owner_field=owner_field, error=error)


def _outcome(error: StatusError) -> Any:
    return "notfound" if error.code == 404 else "deny"


def _owner_rules(
    rev: str,
    m: Match,
    identity: Identity,
    target: RequestTarget,
    obj: Any,
    conceal: bool,
) -> Verdict:
    """Only owner rules grant this request: filter a list, check a create's owner, or
    decide an item by its stored owner (an unowned and a missing object alike: 404)."""
    first = m.owner[0]
    verb, tenant = target.verb, identity.tenant
    if not owner_rule_decides(verb, target.name):
        return _refused(
            rev,
            identity,
            target,
            conceal,
            f"{verb} is granted only by an owner rule ({first.explain()}), which cannot decide it",
            first.owner_field,
        )
    if verb in ("list", "watch", "create"):  # lists, watches filtered; a create's body checked
        what = {"list": "listed", "watch": "watched"}.get(verb, "created")
        return Verdict(
            "filter",
            f"only objects owned by tenant {tenant!r} may be {what}: owner rule via "
            f"{first.explain()}",
            rev,
            target,
            first.explain(),
            first.rule_id,
            first.owner_field,
        )
    for grant in m.owner:
        if obj is not None and owner_value(obj, grant.owner_field) == tenant:
            return Verdict(
                "allow",
                f"allowed by owner rule ({grant.owner_field} is {tenant!r}) via {grant.explain()}",
                rev,
                target,
                grant.explain(),
                grant.rule_id,
                grant.owner_field,
                needs_object=True,
            )
    return Verdict(
        "notfound",
        f'{target.resource} "{target.name}" is reachable only through an owner rule '
        f"({first.explain()}) and tenant {tenant!r} does not own it ({first.owner_field})",
        rev,
        target,
        owner_field=first.owner_field,
        needs_object=True,
        error=not_found(target.resource, target.name),
    )


def _owner_constraints(
    engine: PolicyEngine,
    cache: DecisionCache | None,
    verdict: Verdict,
    m: Match,
    identity: Identity,
    target: RequestTarget,
    body: Any,
    patch: PatchKind,
    before: Any,
) -> Verdict:
    """An allowed request: what owner rules still ask of it. A list granted by owner
    rules only is filtered; the body of a write of an object that carries an owner
    keeps the owner the caller's tenant, unless a cluster-wide grant allows it."""
    list_field = (
        verdict.owner_field
        if verdict.outcome == "filter" and target.verb in ("list", "watch")
        else ""
    )
    fields: dict[str, None] = {}
    foreign = False
    if target.resource_request and target.verb in _OWNER_BODY_VERBS and not target.subresource:
        fields = dict.fromkeys(g.owner_field for g in _owner_grants(m))
        fields.update(dict.fromkeys(engine.owner_fields(target.api_group, target.resource)))
        if fields and m.unconditional is not None:
            foreign = (
                cache.cluster_wide(engine, identity, target)
                if cache is not None
                else engine.cluster_wide(identity, target)
            )
    body_fields = () if foreign else tuple(fields)
    if not (list_field or body_fields or foreign) and verdict.owner == NO_OWNER_CONSTRAINTS:
        return verdict  # the common case, on every request: nothing to add
    owner = OwnerConstraints(list_field, body_fields, foreign)
    if not body_fields:
        return dataclasses.replace(verdict, owner=owner)
    if body is NO_BODY:
        return dataclasses.replace(verdict, owner=owner, needs_body=True)
    try:
        checked = enforce_owner(body, identity.tenant, body_fields, target.verb, patch, before)
    except StatusError as exc:
        if exc.code != 403:
            raise
        return dataclasses.replace(
            verdict,
            outcome="deny",
            reason=exc.message,
            owner=owner,
            held=_OWNER_HELD,
            error=exc,
        )
    return dataclasses.replace(verdict, owner=owner, body=checked)


_OWNER_HELD = "owner fields: a write never sets another tenant as owner, in any mode"


def _mode_rule(
    engine: PolicyEngine,
    verdict: Verdict,
    m: Match,
    identity: Identity,
    target: RequestTarget,
    body: Any,
    patch: PatchKind,
    before: Any,
) -> Verdict:
    """A refusal: whether a mode may relax it (`relaxable`), or why none does (`held`).
    The one place of this rule. A relaxable write that carries owner fields is relaxed
    only with its body checked as an allowed one would be (owner left the caller's
    tenant, filled in when empty): `needs_body` until the body is given."""
    held = verdict.held or _held(verdict, identity, target)
    if held:
        return dataclasses.replace(verdict, relaxable=False, held=held)
    fields: dict[str, None] = {}
    if target.verb in _OWNER_BODY_VERBS and not target.subresource:
        fields = dict.fromkeys(g.owner_field for g in _owner_grants(m))
        fields.update(dict.fromkeys(engine.owner_fields(target.api_group, target.resource)))
    if not fields:
        return dataclasses.replace(verdict, relaxable=True)
    owner = OwnerConstraints(body_fields=tuple(fields))
    if body is NO_BODY:
        return dataclasses.replace(verdict, relaxable=True, owner=owner, needs_body=True)
    try:
        checked = enforce_owner(
            body, identity.tenant, owner.body_fields, target.verb, patch, before
        )
    except StatusError as exc:
        if exc.code != 403:
            raise
        held = f"{_OWNER_HELD} ({exc.message})"
        return dataclasses.replace(verdict, relaxable=False, held=held, owner=owner)
    return dataclasses.replace(verdict, relaxable=True, owner=owner, body=checked)


def _held(verdict: Verdict, identity: Identity, target: RequestTarget) -> str:
    """Why no mode relaxes this refusal ("": a mode may)."""
    if verdict.isolated:
        return "isolation: another tenant or the cluster level is out of reach in every mode"
    if verdict.status == 404:
        return "concealment: a 404 is the same in every mode"
    if not target.resource_request:
        return "a non-resource URL is outside every tenant: refused in every mode"
    if (target.api_group, target.resource) in REVIEWS:
        return "access reviews are answered the same in every mode"
    if target.verb == "impersonate":
        return "impersonation is checked in every mode"
    if not inside_caller_tenant(identity, target):
        where = (
            f"the cluster-scoped {target.full_resource}"
            if target.scope == Scope.CLUSTER
            else f"tenant {target.tenant!r}"
        )
        return f"{where} is outside the caller's tenant {identity.tenant!r}: refused in every mode"
    return ""


def _owner_grants(m: Match) -> tuple[Grant, ...]:
    return m.owner if m.unconditional is None else ()

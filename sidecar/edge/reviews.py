"""Access and identity reviews, answered by the sidecar itself, never forwarded (DESIGN §5).

`POST` at `/apis/authorization.k8s.io/v1[/tenants/{t}]/…`:
- `selfsubjectaccessreviews` ("can I?", `kubectl auth can-i`) and
  `subjectaccessreviews` ("can user U of this tenant?", for callers the policy allows
  `create` on `subjectaccessreviews` there): `spec.resourceAttributes` or
  `spec.nonResourceAttributes` → `status.allowed`, `status.denied`, `status.reason`;
- `selfsubjectrulesreviews` (`kubectl auth can-i --list`): `spec.namespace` →
  `status.resourceRules`, `status.nonResourceRules`, `status.incomplete` (the rules in
  force, `policy/rules.py`; owner rules are left out: they grant nothing
  unconditionally);
and `POST /apis/authentication.k8s.io/v1/selfsubjectreviews` (`kubectl auth whoami`):
`status.userInfo` with the username, groups and `extra.tenant`.

At the standard paths (no `tenants/{t}`) a review concerns the caller's tenant, as a
short path does (`default` for the system tenant's operators). A review runs after
identity and the rate limit, like any request; it is authorized by the one decision
function (self reviews are a built-in grant), and the request it describes is decided
by that same function with the same owner read, so it answers exactly what that
request would get: an object the caller does not own and a missing one get the same
answer. Without a namespace the described request is tenant-wide (`/tenants/{t}/pods`),
or cluster-level for a cluster-scoped resource; `resourceAttributes.scope: cluster`
asks about the list across all tenants (`/api/v1/pods`).

`status.allowed` is the policy's answer in every mode. When the subject's mode (the
global one, or its tenant's `TenantMode`) is dry-run, `status.reason` also says so and
what the live request gets (`mode: dry-run (tenant acme): would deny, forwarded`);
reviews themselves are answered the same in every mode.

Bad input is a 400 Status: a body that is not a JSON object, a wrong `kind` or
`apiVersion`, no `spec`, neither or both of the attribute kinds; a method other than
POST is 405.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.core.redact import policy_file_names
from sidecar.core.status import StatusError, bad_request
from sidecar.core.target import RequestTarget, Scope, is_dns1123_label
from sidecar.pipeline.context import RequestContext
from sidecar.policy.compile import ANY
from sidecar.policy.decide import AUTHENTICATION_GROUP, AUTHORIZATION_GROUP, normalize
from sidecar.policy.isolation import impersonation_hint
from sidecar.policy.kinds.modes import ENFORCE, describe, mode_for, mode_source
from sidecar.policy.scopes import CLUSTER_SCOPED, TENANT_OBJECTS, is_cluster_scoped
from sidecar.policy.tools.rules import rules_in_force
from sidecar.services.audit import authz_record

if TYPE_CHECKING:
    from sidecar.pipeline.authorize import Authorizer
    from sidecar.services.metrics import Metrics

SELF_ACCESS = "selfsubjectaccessreviews"
SUBJECT_ACCESS = "subjectaccessreviews"
SELF_RULES = "selfsubjectrulesreviews"
SELF_SUBJECT = "selfsubjectreviews"
KINDS: dict[tuple[str, str], str] = {
    (AUTHORIZATION_GROUP, SELF_ACCESS): "SelfSubjectAccessReview",
    (AUTHORIZATION_GROUP, SUBJECT_ACCESS): "SubjectAccessReview",
    (AUTHORIZATION_GROUP, SELF_RULES): "SelfSubjectRulesReview",
    (AUTHENTICATION_GROUP, SELF_SUBJECT): "SelfSubjectReview",
}
AUTHENTICATED = "system:authenticated"


def is_review(target: RequestTarget) -> bool:
    """Whether the request is one of the reviews this module answers."""
    return (
        target.resource_request
        and (target.api_group, target.resource) in KINDS
        and target.scope == Scope.TENANT
        and not target.name
        and not target.subresource
    )


class ReviewApi:
    """Answers reviews for the authorize stage (`AuthorizeStage(…, reviews=ReviewApi(…))`)."""

    def __init__(self, metrics: Metrics, global_mode: str = ENFORCE) -> None:
        self.metrics = metrics
        # The config's `mode`: a SubjectAccessReview's subject may be of another
        # tenant than the caller, so its mode is looked up, not the caller's.
        self.global_mode = global_mode

    def handles(self, target: RequestTarget) -> bool:
        return is_review(target)

    async def answer(self, ctx: RequestContext, authz: Authorizer) -> web.StreamResponse:
        identity, target = ctx.authenticated(), ctx.target
        assert target is not None  # the authorize stage hands over parsed targets only
        kind = KINDS[(target.api_group, target.resource)]
        if target.verb != "create":
            raise StatusError(
                405, f"a {kind} can only be created (POST)", headers={"Allow": "POST"}
            )
        target = normalize(target, identity)
        own = await authz.authorize(ctx, identity, target, read_body=False)
        ctx.decision = own
        label = self.metrics.tenant(identity.tenant)
        self.metrics.child(self.metrics.decisions, label, own.outcome).inc()
        record = authz_record(own)
        ctx.audit["authz"] = record
        if not own.allowed:
            raise own.refusal()
        spec = _spec(await ctx.read_json(), kind, target)
        tenant = target.tenant_for(identity.tenant)
        if kind == "SelfSubjectReview":
            status: dict[str, Any] = {"userInfo": user_info(identity)}
        elif kind == "SelfSubjectRulesReview":
            status = _rules(ctx, identity, tenant, spec)
        else:
            subject = identity if kind == "SelfSubjectAccessReview" else _subject(spec, tenant)
            asked = review_target(spec, tenant)
            v = await authz.authorize(ctx, subject, asked, read_body=False, fetch_as=identity)
            record["review"] = v.outcome
            record["reviewReason"] = v.reason.replace(ANY, "*")
            reason = v.reason
            if not v.allowed:
                reason += impersonation_hint(subject)
            modes = ctx.policy.tenant_modes
            mode = mode_for(self.global_mode, modes, subject.tenant)
            if mode != ENFORCE:
                reason += f" (mode: {describe(mode, mode_source(modes, subject.tenant), v)})"
            reason = reason.replace(ANY, "*")  # the review's "any" as the caller wrote it
            status = {"allowed": v.allowed, "reason": policy_file_names(reason)}
            if not v.allowed:
                status["denied"] = True
        answer: dict[str, Any] = {
            "kind": kind,
            "apiVersion": f"{target.api_group}/{target.api_version}",
            "metadata": {"creationTimestamp": None},
        }
        if kind != "SelfSubjectReview":
            answer["spec"] = spec
        answer["status"] = status
        return web.json_response(answer, status=201, headers=ctx.response_headers)


def user_info(identity: Identity) -> dict[str, Any]:
    """Kubernetes `UserInfo` of the caller; the tenant is in `extra.tenant`."""
    groups = list(identity.groups)
    if AUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return {"username": identity.user, "groups": groups, "extra": {"tenant": [identity.tenant]}}


def _spec(body: Any, kind: str, target: RequestTarget) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a {kind} JSON object")
    if body.get("kind") not in (None, kind):
        raise bad_request(f"kind must be {kind!r}, not {body.get('kind')!r}")
    version = body.get("apiVersion")
    if version is not None and version != f"{target.api_group}/{target.api_version}":
        raise bad_request(
            f"apiVersion must be '{target.api_group}/{target.api_version}', not {version!r}"
        )
    spec = body.get("spec", {} if kind == "SelfSubjectReview" else None)
    if not isinstance(spec, dict):
        raise bad_request(f"a {kind} needs a 'spec' object")
    return spec


def _rules(
    ctx: RequestContext, identity: Identity, tenant: str, spec: dict[str, Any]
) -> dict[str, Any]:
    namespace = _str(spec, "namespace")
    if namespace and not is_dns1123_label(namespace):
        raise bad_request(f"namespace {namespace!r} is not a valid namespace name")
    rules = rules_in_force(ctx.policy.engine, identity, tenant, namespace)
    return {
        "resourceRules": [r.as_k8s() for r in rules.resource_rules],
        "nonResourceRules": [r.as_k8s() for r in rules.non_resource_rules],
        "incomplete": False,
    }


def _str(d: dict[str, Any], key: str, *, required: bool = False) -> str:
    value = d.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise bad_request(f"{key!r} must be a string")
    if required and not value:
        raise bad_request(f"{key!r} is required")
    return value


def _subject(spec: dict[str, Any], tenant: str) -> Identity:
    user = _str(spec, "user", required=True)
    groups = spec.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise bad_request("'groups' must be a list of strings")
    return Identity(user, tenant, tuple(groups), "subjectaccessreview")


def _cluster_level_in_some_group(resource: str) -> bool:
    """A review whose group is `*` asks about the resource in every group: it is
    cluster-level when the resource is cluster-scoped (or stands for a tenant) in any
    of them, so a tenant's `*` rule never answers yes for `nodes`, `tenants` or
    `quotas`, whose real requests it cannot reach (found by hostile review)."""
    return any(res == resource for _, res in CLUSTER_SCOPED | TENANT_OBJECTS)


def review_target(spec: dict[str, Any], tenant: str) -> RequestTarget:
    """The request an access review describes, in `tenant` (the review's)."""
    res_attrs, url_attrs = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if (res_attrs is None) == (url_attrs is None):
        raise bad_request("spec needs exactly one of resourceAttributes, nonResourceAttributes")
    if url_attrs is not None:
        if not isinstance(url_attrs, dict):
            raise bad_request("nonResourceAttributes must be an object")
        path = _str(url_attrs, "path", required=True)
        if not path.startswith("/"):
            raise bad_request("nonResourceAttributes.path must start with '/'")
        verb = _str(url_attrs, "verb", required=True).lower()
        return RequestTarget(path=path, verb=verb, resource_request=False)
    if not isinstance(res_attrs, dict):
        raise bad_request("resourceAttributes must be an object")
    verb = _str(res_attrs, "verb", required=True)
    group = _str(res_attrs, "group")
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
    # kubectl sends its context's namespace even for cluster-scoped resources ("resource
    # 'nodes' is not namespace scoped"): the request it describes is cluster-level. So is
    # an object named by a tenant (the Tenant, its quota): `decide` puts it in that tenant.
    if (
        scope_name == "cluster"
        or is_cluster_scoped(group, resource)
        or (group, resource) in TENANT_OBJECTS
        or (group == "*" and _cluster_level_in_some_group(resource))
    ):
        scope, namespace = Scope.CLUSTER, ""
    for value in (verb, group, resource, namespace, scope_name):
        if any(c < " " or c == "\x7f" for c in value):
            raise bad_request("resourceAttributes hold no control characters")
    # `*` asks about any verb / group / resource: allowed exactly when a rule with `*`
    # there grants it (Kubernetes semantics, `kubectl auth can-i '*' '*'`).
    verb, group, resource = (ANY if v == "*" else v for v in (verb, group, resource))
    return RequestTarget(
        path="",
        verb=verb,
        resource_request=True,
        api_group=group,
        api_version=_str(res_attrs, "version") or "v1",
        scope=scope,
        tenant=None if scope == Scope.CLUSTER else tenant,
        namespace=namespace or None,
        resource=resource,
        subresource=_str(res_attrs, "subresource"),
        name=_str(res_attrs, "name"),
    )

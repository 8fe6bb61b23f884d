"""Hard tenant isolation (DESIGN §5): the one rule for 404 versus 403.

`policy.decide.decide` calls these two functions; nothing else decides how a refusal
is answered, so the running sidecar, `policy explain`, `policy test`, access reviews
and the quota API cannot disagree.

- `outside_caller_tenant`: the target names another tenant, or addresses the cluster
  level (a cluster-scoped resource or a list across all tenants). Such a request goes
  on only when a binding in force for the caller could reach it (`engine.can_reach`:
  ClusterRoleBindings, and a tenant's owner rules for cluster-scoped objects);
  otherwise it is refused by isolation and the caller learns nothing.
- `inside_caller_tenant`: the other side of the boundary, for modes (DESIGN §5): a
  mode (dry-run) relaxes only refusals of a request inside the caller's own tenant
  (its namespaces and tenant-scoped resources). A cluster-scoped object never is,
  not even one that stands for the caller's tenant (its Tenant object, its quota), nor
  a non-resource URL. `decide` builds `Verdict.relaxable` on it; the quota stage asks
  it of a quota refusal (whose quota: the target's tenant).
- `refusal`: how a refused request is answered.
  * A target in the caller's own tenant (its namespaces, and its own Tenant object
    `/api/v1/tenants/{own}` or its own quota): 403, the caller knows its tenant exists.
  * With concealment on (`concealOtherTenants`, the default): a target in another
    tenant that isolation refused gets exactly the 404 of a tenant that does not
    exist; a cluster-level target refused to a tenant user gets the resource's 404
    (`nodes "n1" not found`), whatever the reason, so a tenant cannot tell a node it
    may not touch from one that does not exist.
  * Users of the `system` tenant are operators: a cluster-level refusal is an honest
    403 for them (they know what exists). A target in another tenant is concealed
    from them like from anyone, except the reserved tenants `default` and `system`,
    which always exist (§5): concealing them from a `system` identity (an operator's
    `kubectl --as alice`, alice of tenant `system`) would answer a lie, `tenants
    "default" not found`; the answer is an honest 403 that says who was refused.
  * The sidecar's own quota API (`quota.sidecar`) hides nothing at cluster level
    (its URLs are documented and hold no tenant's objects): 403 there, except for a
    target naming another tenant.
  * Everything else, and everything with concealment off: 403.

Whatever the policy, a tenant user's request never returns an object stored under
another tenant: `engine.request_vector` gives a tenant's own bindings no domain
outside that tenant except cluster-scoped objects through owner rules.
"""

from __future__ import annotations

from sidecar.core.identity import Identity
from sidecar.core.status import (
    StatusError,
    forbidden,
    forbidden_message,
    not_found,
    tenant_not_found,
)
from sidecar.core.target import RESERVED_TENANTS, RequestTarget, Scope

# The sidecar's own quota API, authorized as this group's cluster-scoped `quotas`. Its
# URLs are documented and hold no tenant's objects at cluster level, so a refusal there
# is never concealed (only a target naming another tenant is).
QUOTA_GROUP = "quota.sidecar"
UNCONCEALED_GROUPS: frozenset[str] = frozenset({QUOTA_GROUP})


def outside_caller_tenant(identity: Identity, target: RequestTarget) -> bool:
    """Whether the target lies outside the caller's own tenant."""
    if not target.resource_request:
        return False
    if target.tenant is not None:
        return target.tenant != identity.tenant
    return target.scope == Scope.CLUSTER


def inside_caller_tenant(identity: Identity, target: RequestTarget) -> bool:
    """Whether the target lies inside the caller's own tenant, below the cluster level:
    the only place where a mode may relax a refusal."""
    return (
        target.resource_request
        and target.scope != Scope.CLUSTER
        and target.tenant is not None
        and target.tenant == identity.tenant
    )


def refusal(
    identity: Identity, target: RequestTarget, *, conceal: bool, isolated: bool
) -> StatusError:
    """The answer to a refused request: 404 (concealed) or 403. `isolated`: refused
    because no binding in force reaches the target at all."""
    if not target.resource_request:
        return forbidden(forbidden_message(identity.user, identity.tenant, target))
    own_tenant = target.tenant == identity.tenant
    cluster = target.scope == Scope.CLUSTER
    operator_at_cluster = cluster and identity.is_operator
    # The reserved tenants always exist and operators know it: concealing them from a
    # `system` identity (`kubectl --as alice` without a tenant) would say a lie.
    operator_reserved = identity.is_operator and target.tenant in RESERVED_TENANTS
    if conceal and not own_tenant and not operator_at_cluster and not operator_reserved:
        if target.tenant is not None and (isolated or cluster):
            return tenant_not_found(target.tenant)
        if target.tenant is None and cluster and target.api_group not in UNCONCEALED_GROUPS:
            return not_found(target.resource, target.name)
    if isolated and not own_tenant:
        return forbidden(isolation_message(identity, target) + impersonation_hint(identity))
    message = forbidden_message(identity.user, identity.tenant, target)
    return forbidden(message + impersonation_hint(identity))


def impersonation_hint(identity: Identity) -> str:
    """What an operator impersonating a user without naming a tenant should know: the
    user is one of the operator's own tenant (`system`), not of any tenant (DESIGN §4);
    kubectl names a tenant only through the kubeconfig's `as-user-extra`."""
    by = identity.impersonated_by
    if by is None or not identity.is_operator or by.tenant != identity.tenant:
        return ""
    return (
        f' (impersonated: "{identity.user}" of tenant "{identity.tenant}", the '
        "impersonator's own; to act as a tenant's user name its tenant, "
        "e.g. kubeconfig as-user-extra: {tenant: [acme]} or `sidecar kubeconfig --as "
        f"{identity.user} --as-tenant acme`)"
    )


def isolation_message(identity: Identity, target: RequestTarget) -> str:
    who = f'user "{identity.user}" of tenant "{identity.tenant}"'
    if target.tenant is not None and target.tenant != identity.tenant:
        return f'{who} cannot access tenant "{target.tenant}"'
    what = f'{target.full_resource} "{target.name}"' if target.name else target.full_resource
    return f"{who} cannot access the cluster-scoped {what}"

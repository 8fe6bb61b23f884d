"""Hard tenant isolation (DESIGN §5): runs after identity, before any policy decision.

A request that leaves the caller's tenant, i.e. names another tenant, or addresses the
cluster level (a cluster-scoped resource or a list across all tenants), goes on only
when the policy engine says a binding in force for the caller could reach it
(`engine.can_reach`). Otherwise the caller learns nothing: 404 with exactly the body a
tenant that does not exist gets (or the resource's NotFound at cluster level), and
with `concealOtherTenants: false` a plain 403. Such a request never reaches the
upstream.

Whatever the policy, a tenant user's request never returns an object stored under
another tenant: a target in another tenant, or a list of a namespaced or tenant-scoped
resource across all tenants (`/api/v1/pods`), is reachable through a
ClusterRoleBinding only; a tenant's own bindings reach the cluster level only for
cluster-scoped objects it owns (owner rules; `policy/scopes.py` knows which resources
are cluster-scoped, and `engine.request_vector` applies it to every decision).
"""

from __future__ import annotations

from aiohttp import web

from sidecar.context import Identity, RequestContext
from sidecar.errors import StatusError, forbidden, not_found, tenant_not_found
from sidecar.pipeline import Handler, Stage
from sidecar.runtime import Runtime
from sidecar.target import RequestTarget, Scope


def outside_caller_tenant(identity: Identity, target: RequestTarget) -> bool:
    """Whether the target lies outside the caller's own tenant."""
    if not target.resource_request:
        return False
    if target.tenant is not None:
        return target.tenant != identity.tenant
    return target.scope == Scope.CLUSTER


def refusal(identity: Identity, target: RequestTarget, conceal: bool) -> StatusError:
    """The error for a target the caller may not reach."""
    if conceal:
        if target.tenant is not None:
            return tenant_not_found(target.tenant)
        return not_found(target.full_resource, target.name)
    if target.tenant is not None:
        return forbidden(
            f'user "{identity.user}" of tenant "{identity.tenant}" cannot access '
            f'tenant "{target.tenant}"'
        )
    what = f'{target.full_resource} "{target.name}"' if target.name else target.full_resource
    return forbidden(
        f'user "{identity.user}" of tenant "{identity.tenant}" cannot access the '
        f"cluster-scoped {what}"
    )


class IsolationStage:
    name = "isolation"

    def __init__(self, conceal: bool) -> None:
        self.conceal = conceal

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        identity, target = ctx.identity, ctx.target
        if identity is None or target is None:
            raise StatusError(500, "the isolation stage ran before identity/parse")
        if outside_caller_tenant(identity, target):
            if not ctx.policy.engine.can_reach(identity, target):
                ctx.audit["isolation"] = "concealed" if self.conceal else "forbidden"
                raise refusal(identity, target, self.conceal)
            ctx.audit["isolation"] = "cross-tenant-granted"
        return await call_next(ctx)


def make_stage(rt: Runtime) -> Stage:
    return IsolationStage(rt.config.conceal_other_tenants)

"""Which resources are cluster-scoped, and which carry an owner field.

The URL alone cannot tell a cluster-scoped resource (`/api/v1/nodes`) from a list of
a namespaced one across every tenant (`/api/v1/pods`). Owner rules from a tenant's
bindings may reach the first kind only (DESIGN §5): objects stored under a tenant are
reachable across tenants through a ClusterRoleBinding alone. The table is the
reference backing store's cluster-scoped types plus the standard Kubernetes ones; a
contract test keeps it in step with `backing_store/resources.py` (the sidecar never
imports the store). A resource not in the table is treated as stored under tenants:
fail closed.

`DEFAULT_OWNER_FIELDS` are the resources whose owner field the sidecar knows even
when no owner rule names them (Ironic nodes and allocations); the policy's owner
rules add their own `(resource, ownerField)` pairs (`PolicyEngine.owner_fields`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.policy.isolation import QUOTA_GROUP

# (API group, plural)
CLUSTER_SCOPED: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "tenants"),
        ("", "nodes"),
        ("", "persistentvolumes"),
        ("", "componentstatuses"),
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"),
        ("storage.k8s.io", "storageclasses"),
        ("storage.k8s.io", "csidrivers"),
        ("storage.k8s.io", "csinodes"),
        ("storage.k8s.io", "volumeattachments"),
        ("scheduling.k8s.io", "priorityclasses"),
        ("node.k8s.io", "runtimeclasses"),
        ("networking.k8s.io", "ingressclasses"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("apiregistration.k8s.io", "apiservices"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
        ("certificates.k8s.io", "certificatesigningrequests"),
    }
)

# (API group, plural) of tenant-scoped resources: objects of one tenant, in no namespace.
TENANT_SCOPED: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "namespaces"),
        ("baremetal", "allocations"),
        ("rbac.authorization.k8s.io", "tenantroles"),
        ("rbac.authorization.k8s.io", "tenantrolebindings"),
    }
)

# (API group, plural) → owner field, known without any owner rule.
DEFAULT_OWNER_FIELDS: dict[tuple[str, str], str] = {
    ("", "nodes"): "spec.owner",
    ("baremetal", "allocations"): "spec.owner",
}


# An access review's "any group" (`policy.compile.ANY`, which this module cannot import).
_ANY_GROUP = "\x00*"


def is_cluster_scoped(group: str, resource: str) -> bool:
    """Whether `resource` (a plural, `res/sub` allowed) of `group` is cluster-scoped; for
    a review's "any group", whether it is in some group (a `*` group asks about all)."""
    base = resource.partition("/")[0]
    if group == _ANY_GROUP:
        return any(res == base for _, res in CLUSTER_SCOPED | TENANT_OBJECTS)
    return (group, base) in CLUSTER_SCOPED


def is_tenant_scoped(group: str, resource: str) -> bool:
    return (group, resource.partition("/")[0]) in TENANT_SCOPED


def owner_rule_warning(groups: Sequence[str], resources: Sequence[str]) -> str:
    """Why an owner rule on these resources is probably not what its author meant, or
    "" when every resource it names is cluster- or tenant-scoped (Ironic nodes,
    restricted allocations). Owner rules never reach another tenant's objects."""
    odd: list[str] = []
    for res in resources:
        base = res.partition("/")[0]
        if base == "*":
            odd.append(res)
            continue
        groups_known = [g for g in groups if g != "*"] or [""]
        if not any(is_cluster_scoped(g, base) or is_tenant_scoped(g, base) for g in groups_known):
            odd.append(res)
    if not odd:
        return ""
    return (
        f"WARNING: 'when: owner' on {', '.join(repr(r) for r in odd)}, which may be "
        "namespaced: owner rules reach cluster-scoped objects only, so this rule never "
        "grants another tenant's objects (nor a list across tenants); it only filters "
        "objects inside the binding's own tenant"
    )


# Cluster-scoped objects that stand for one tenant (named by it): the Tenant object and
# the tenant's quota. Their target tenant is their name (`decide` sets it), so isolation
# treats them as inside that tenant.
TENANT_OBJECTS: frozenset[tuple[str, str]] = frozenset({("", "tenants"), (QUOTA_GROUP, "quotas")})

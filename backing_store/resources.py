"""The resource table of the reference backing store (DESIGN §10).

One row per resource type: API group, version, plural, kind and scope. Add a row to
serve a new type; everything else (keys, CRUD, lists, watch) follows from it. Key
layout follows the Alkaid design: `/registry/{plural}/{name}` (cluster),
`/registry/{plural}/{tenant}/{name}` (tenant), `/registry/{plural}/{tenant}/{ns}/{name}`
(namespace).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["cluster", "tenant", "namespace"]

CLUSTER: Scope = "cluster"
TENANT: Scope = "tenant"
NAMESPACE: Scope = "namespace"


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    scope: Scope

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def key(self, tenant: str | None, namespace: str | None, name: str) -> str:
        return self.prefix(tenant, namespace) + name

    def prefix(self, tenant: str | None = None, namespace: str | None = None) -> str:
        """The key prefix of a collection: narrower when tenant/namespace are given."""
        parts = ["", "registry", self.plural]
        if tenant is not None and self.scope != CLUSTER:
            parts.append(tenant)
            if namespace is not None and self.scope == NAMESPACE:
                parts.append(namespace)
        return "/".join(parts) + "/"


_CORE_CLUSTER = {"Tenant": "tenants", "Node": "nodes", "PersistentVolume": "persistentvolumes"}
_CORE_TENANT = {"Namespace": "namespaces"}
_CORE_NAMESPACED = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "ResourceQuota": "resourcequotas",
    "Event": "events",
    "Endpoints": "endpoints",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ReplicationController": "replicationcontrollers",
    "LimitRange": "limitranges",
}

_TABLE: list[ResourceType] = [
    *(ResourceType("", "v1", p, k, CLUSTER) for k, p in _CORE_CLUSTER.items()),
    *(ResourceType("", "v1", p, k, TENANT) for k, p in _CORE_TENANT.items()),
    *(ResourceType("", "v1", p, k, NAMESPACE) for k, p in _CORE_NAMESPACED.items()),
    ResourceType("apps", "v1", "deployments", "Deployment", NAMESPACE),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", NAMESPACE),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", NAMESPACE),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", NAMESPACE),
    ResourceType("apps", "v1", "controllerrevisions", "ControllerRevision", NAMESPACE),
    ResourceType("batch", "v1", "jobs", "Job", NAMESPACE),
    ResourceType("batch", "v1", "cronjobs", "CronJob", NAMESPACE),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", NAMESPACE),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", NAMESPACE),
    ResourceType("rbac.authorization.k8s.io", "v1", "tenantroles", "TenantRole", TENANT),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "tenantrolebindings", "TenantRoleBinding", TENANT
    ),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", CLUSTER),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", CLUSTER
    ),
    ResourceType("compute", "v1", "servers", "Server", NAMESPACE),
    ResourceType("baremetal", "v1", "allocations", "Allocation", TENANT),
    ResourceType("container", "v1", "bays", "Bay", NAMESPACE),
]

RESOURCES: dict[tuple[str, str, str], ResourceType] = {
    (r.group, r.version, r.plural): r for r in _TABLE
}
BY_PLURAL: dict[str, ResourceType] = {r.plural: r for r in _TABLE}
# Plurals must be unique: keys are /registry/{plural}/..., whatever the group.
assert len(BY_PLURAL) == len(_TABLE), "duplicate plural in the resource table"

TENANTS = BY_PLURAL["tenants"]
NAMESPACES = BY_PLURAL["namespaces"]
SERVERS = BY_PLURAL["servers"]
NODES = BY_PLURAL["nodes"]
ALLOCATIONS = BY_PLURAL["allocations"]


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return RESOURCES.get((group, version, plural))


def under_tenant() -> list[ResourceType]:
    """Types whose objects live inside a tenant (deleted with it)."""
    return [r for r in _TABLE if r.scope != CLUSTER]


def namespaced() -> list[ResourceType]:
    return [r for r in _TABLE if r.scope == NAMESPACE]

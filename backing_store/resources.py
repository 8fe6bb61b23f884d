"""The resource table of the reference backing store (DESIGN §10).

One row per resource type: API group, version, plural, kind, scope, and the discovery
extras (`shortNames`, `categories`, extra subresources). Add a row to serve a new type;
everything else (keys, CRUD, lists, watch, discovery documents) follows from it. Key
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
    # Discovery only: kubectl's abbreviations (`kubectl get cm`) and `kubectl get all`.
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # Subresources besides `status` (which every type has): name -> (kind, verbs).
    subresources: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

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


_ALL = ("all",)
_TABLE: list[ResourceType] = [
    # core v1, cluster-scoped
    ResourceType("", "v1", "tenants", "Tenant", CLUSTER),
    ResourceType(
        "",
        "v1",
        "nodes",
        "Node",
        CLUSTER,
        ("no",),
        subresources=(("power", "NodePower", ("get", "update")),),
    ),
    ResourceType("", "v1", "persistentvolumes", "PersistentVolume", CLUSTER, ("pv",)),
    # core v1, tenant-scoped
    ResourceType("", "v1", "namespaces", "Namespace", TENANT, ("ns",)),
    # core v1, namespace-scoped
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        NAMESPACE,
        ("po",),
        _ALL,
        # `kubectl drain` evicts: an eviction deletes the pod (no disruption budgets).
        subresources=(("eviction", "Eviction", ("create",)),),
    ),
    ResourceType("", "v1", "services", "Service", NAMESPACE, ("svc",), _ALL),
    ResourceType("", "v1", "configmaps", "ConfigMap", NAMESPACE, ("cm",)),
    ResourceType("", "v1", "secrets", "Secret", NAMESPACE),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", NAMESPACE, ("sa",)),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", NAMESPACE, ("quota",)),
    ResourceType("", "v1", "events", "Event", NAMESPACE, ("ev",)),
    ResourceType("", "v1", "endpoints", "Endpoints", NAMESPACE, ("ep",)),
    ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", NAMESPACE, ("pvc",)),
    ResourceType(
        "", "v1", "replicationcontrollers", "ReplicationController", NAMESPACE, ("rc",), _ALL
    ),
    ResourceType("", "v1", "limitranges", "LimitRange", NAMESPACE, ("limits",)),
    ResourceType("apps", "v1", "deployments", "Deployment", NAMESPACE, ("deploy",), _ALL),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", NAMESPACE, ("rs",), _ALL),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", NAMESPACE, ("sts",), _ALL),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", NAMESPACE, ("ds",), _ALL),
    ResourceType("apps", "v1", "controllerrevisions", "ControllerRevision", NAMESPACE),
    ResourceType("batch", "v1", "jobs", "Job", NAMESPACE, (), _ALL),
    ResourceType("batch", "v1", "cronjobs", "CronJob", NAMESPACE, ("cj",), _ALL),
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
    # the seeds' own types
    ResourceType(
        "compute",
        "v1",
        "servers",
        "Server",
        NAMESPACE,
        ("srv",),
        subresources=(("tags", "ServerTags", ("get", "update", "delete")),),
    ),
    # The rest of what `kubectl create` generators make (DESIGN §10, protobuf kinds).
    ResourceType(
        "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", NAMESPACE, ("pdb",)
    ),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", CLUSTER, ("pc",)),
    ResourceType("networking.k8s.io", "v1", "ingresses", "Ingress", NAMESPACE, ("ing",)),
    ResourceType("baremetal", "v1", "allocations", "Allocation", TENANT),
    ResourceType("container", "v1", "bays", "Bay", NAMESPACE),
]

RESOURCES: dict[tuple[str, str, str], ResourceType] = {
    (r.group, r.version, r.plural): r for r in _TABLE
}
BY_PLURAL: dict[str, ResourceType] = {r.plural: r for r in _TABLE}
PODS = BY_PLURAL["pods"]
# Plurals must be unique: keys are /registry/{plural}/..., whatever the group.
assert len(BY_PLURAL) == len(_TABLE), "duplicate plural in the resource table"
# kubectl resolves a short name across all groups: one meaning each.
_SHORT = [s for r in _TABLE for s in r.short_names]
assert len(_SHORT) == len(set(_SHORT)) and not set(_SHORT) & set(BY_PLURAL), "short name clash"

TENANTS = BY_PLURAL["tenants"]
NAMESPACES = BY_PLURAL["namespaces"]
SERVERS = BY_PLURAL["servers"]
NODES = BY_PLURAL["nodes"]
ALLOCATIONS = BY_PLURAL["allocations"]


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return RESOURCES.get((group, version, plural))


def table() -> list[ResourceType]:
    """Every type, in table order (discovery lists them in this order)."""
    return list(_TABLE)


def under_tenant() -> list[ResourceType]:
    """Types whose objects live inside a tenant (deleted with it)."""
    return [r for r in _TABLE if r.scope != CLUSTER]


def namespaced() -> list[ResourceType]:
    return [r for r in _TABLE if r.scope == NAMESPACE]

"""Kubernetes discovery documents, generated from the resource table (DESIGN §10).

`/api` (APIVersions), `/api/v1` and `/apis/{g}/{v}` (APIResourceList), `/apis`
(APIGroupList), `/apis/{g}` (APIGroup) and `/version`: the legacy (non-aggregated)
discovery that kubectl and client libraries fall back to when the answer's
`Content-Type` is plain `application/json`. `/openapi/*` stays 404 (kubectl copes).

Shapes follow k8s.io/apimachinery `metav1`. `namespaced` is true only for
namespace-scoped types: kubectl builds `/namespaces/{ns}/...` paths from it. Tenant-
scoped types (namespaces, tenantroles, ...) are `namespaced: false`, like Kubernetes'
own `namespaces`: kubectl then lists them with a cluster-level path, which the URL
grammar reads as "all tenants the caller may see" (or, for `namespaces`, the caller's
own tenant).
"""

from __future__ import annotations

import platform
from typing import Any

from .errors import StatusError
from .resources import NAMESPACE, NAMESPACES, TENANTS, ResourceType, table

KUBERNETES_VERSION = ("1", "32")
GIT_VERSION = "v1.32.0-sidecar-store"
OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
_ITEM_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
_STATUS_VERBS = ("get", "patch", "update")


def verbs(rt: ResourceType) -> list[str]:
    """What the store serves on the type; tenants and namespaces go one at a time."""
    if rt in (TENANTS, NAMESPACES):
        return list(_ITEM_VERBS)
    return [*_ITEM_VERBS, "deletecollection"]


def _resource(rt: ResourceType) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.kind.lower(),
        "namespaced": rt.scope == NAMESPACE,
        "kind": rt.kind,
        "verbs": verbs(rt),
    }
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    if rt.categories:
        out["categories"] = list(rt.categories)
    return out


# Subresources whose body is of another API group (Kubernetes names it in discovery;
# `kubectl drain` evicts only when `pods/eviction` names its group and version).
_SUBRESOURCE_GROUPS = {"Eviction": ("policy", "v1")}


def _subresources(rt: ResourceType) -> list[dict[str, Any]]:
    subs = [("status", rt.kind, _STATUS_VERBS), *rt.subresources]
    out: list[dict[str, Any]] = []
    for sub, kind, sub_verbs in subs:
        entry: dict[str, Any] = {
            "name": f"{rt.plural}/{sub}",
            "singularName": "",
            "namespaced": rt.scope == NAMESPACE,
            "kind": kind,
            "verbs": list(sub_verbs),
        }
        if kind in _SUBRESOURCE_GROUPS:
            entry["group"], entry["version"] = _SUBRESOURCE_GROUPS[kind]
        out.append(entry)
    return out


def _group_versions() -> dict[str, list[str]]:
    """Group -> versions, in table order; the core group is ""."""
    out: dict[str, list[str]] = {}
    for rt in table():
        versions = out.setdefault(rt.group, [])
        if rt.version not in versions:
            versions.append(rt.version)
    return out


def _gv(group: str, version: str) -> dict[str, str]:
    return {"groupVersion": f"{group}/{version}" if group else version, "version": version}


def _group(group: str, versions: list[str]) -> dict[str, Any]:
    return {
        "name": group,
        "versions": [_gv(group, v) for v in versions],
        "preferredVersion": _gv(group, versions[0]),
    }


def api_versions() -> dict[str, Any]:
    # No address: the store's own is internal (behind the sidecar) and every client
    # reaches the server where it already is. Clients accept the empty list (the
    # Python client requires the field, not an entry).
    return {
        "kind": "APIVersions",
        "versions": _group_versions().get("", []),
        "serverAddressByClientCIDRs": [],
    }


def api_group_list() -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(g, vs) for g, vs in _group_versions().items() if g],
    }


def api_group(group: str) -> dict[str, Any] | None:
    versions = _group_versions().get(group) if group else None
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def api_resource_list(group: str, version: str) -> dict[str, Any] | None:
    types = [rt for rt in table() if (rt.group, rt.version) == (group, version)]
    if not types:
        return None
    resources: list[dict[str, Any]] = []
    for rt in types:
        resources.append(_resource(rt))
        resources.extend(_subresources(rt))
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": _gv(group, version)["groupVersion"],
        "resources": resources,
    }


def version_info() -> dict[str, str]:
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return {
        "major": KUBERNETES_VERSION[0],
        "minor": KUBERNETES_VERSION[1],
        "gitVersion": GIT_VERSION,
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "",
        "platform": f"{platform.system().lower()}/{machine}",
    }


def document(segments: list[str]) -> dict[str, Any] | None:
    """The discovery document at this (already decoded) path, None if it is not one."""
    doc: dict[str, Any] | None = None
    match segments:
        case ["version"]:
            doc = version_info()
        case ["api"]:
            doc = api_versions()
        case ["api", version]:
            doc = api_resource_list("", version)
        case ["apis"]:
            doc = api_group_list()
        case ["apis", group]:
            doc = api_group(group)
        case ["apis", group, version]:
            doc = api_resource_list(group, version)
        case _:
            return None
    if doc is None:
        raise StatusError(
            404, f"the server could not find the requested resource (/{'/'.join(segments)})"
        )
    return doc

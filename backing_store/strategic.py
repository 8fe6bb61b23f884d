"""Strategic merge patch (`application/strategic-merge-patch+json`), kubectl's default
patch type, and the one table of list semantics it needs (DESIGN §10).

A strategic merge patch is a JSON merge patch (maps merge key by key, `null` deletes)
in which some lists merge instead of being replaced: a list of objects by a *patch
merge key* (`containers` by `name`, `ports` by `containerPort`, `conditions` by
`type`, …) and a few lists of scalars as sets (`finalizers`). Which list is which comes
from the published Kubernetes API types (the `patchStrategy`/`patchMergeKey` struct
tags of k8s.io/api core/v1, apps/v1, batch/v1 and apimachinery's ObjectMeta): `TYPES`
below, one entry per Go type, and `ROOTS`, the type of each kind's top level. Every
list not in the table is replaced whole, as Kubernetes does for an untagged list; the
seeds' own kinds (servers, allocations, …) have only ObjectMeta's lists.

Directives, as apimachinery's strategicpatch applies them:
- `"$patch": "replace"` in a map: the map (minus the directive) replaces the original;
  as an element of a merge list: the rest of the patch list replaces the whole list.
- `"$patch": "delete"` in a map: the map becomes empty; as an element of a merge list
  (with the merge key): every original element with that key value goes.
- `"$patch": "merge"`: the default, spelled out (accepted; Kubernetes itself refuses it).
- `"$setElementOrder/<list>": [...]`: the order of a merge list after the merge (the
  patch's items must appear in it in the same order); kubectl sends one with every
  list it patches (`kubectl set image` on one container of two).
- `"$retainKeys": [...]`: original keys of this map that are not listed are cleared
  (kubectl sends it for `volumes` and a Deployment's `strategy`).
- `"$deleteFromPrimitiveList/<list>": [...]`: values removed from a set list.
Any other `$` key, an unknown `$patch` value, or a patch whose shape does not fit
(an element without its merge key, a directive of the wrong type) → 400, and nothing
of a directive is ever stored: a directive inside a value that is new to the object is
applied to an empty original rather than copied.

`TYPES` also gives server-side apply (`apply.py`) its list semantics: a merge list of
objects is an associative list keyed by `ssa_keys` (the API types' `listMapKey`s), a
scalar merge list is a set, every other list is atomic.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .errors import StatusError, bad_request

PATCH = "$patch"
RETAIN_KEYS = "$retainKeys"
SET_ORDER = "$setElementOrder/"
DELETE_FROM = "$deleteFromPrimitiveList/"
_MISSING: Final = object()


@dataclass(frozen=True, slots=True)
class MergeList:
    """A list that merges: by `key` (objects of type `item`), or as a set (`key` None)."""

    key: str | None
    item: str | None = None
    # Server-side apply's key fields (`listMapKey`s), where more than the merge key.
    ssa: tuple[str, ...] = ()

    @property
    def ssa_keys(self) -> tuple[str, ...]:
        return self.ssa or ((self.key,) if self.key else ())


Meta = str | MergeList  # a field: the name of its (map) type, or a merge list
SET = MergeList(None)


def _by(key: str, item: str | None = None, ssa: tuple[str, ...] = ()) -> MergeList:
    return MergeList(key, item, ssa)


_CONDITIONS: dict[str, Meta] = {"conditions": _by("type")}
# Go type -> field -> Meta. Only fields that lead to a merge list are listed.
TYPES: dict[str, dict[str, Meta]] = {
    "ObjectMeta": {"ownerReferences": _by("uid"), "finalizers": SET},
    "PodTemplateSpec": {"metadata": "ObjectMeta", "spec": "PodSpec"},
    "PodSpec": {
        "containers": _by("name", "Container"),
        "initContainers": _by("name", "Container"),
        "ephemeralContainers": _by("name", "Container"),
        "volumes": _by("name"),
        "imagePullSecrets": _by("name"),
        "hostAliases": _by("ip"),
        "topologySpreadConstraints": _by("topologyKey", ssa=("topologyKey", "whenUnsatisfiable")),
        "resourceClaims": _by("name"),
        "schedulingGates": _by("name"),
    },
    "Container": {
        "ports": _by("containerPort", ssa=("containerPort", "protocol")),
        "env": _by("name"),
        "volumeMounts": _by("mountPath"),
        "volumeDevices": _by("devicePath"),
    },
    "PodStatus": {
        **_CONDITIONS,
        "podIPs": _by("ip"),
        "hostIPs": _by("ip"),
        "resourceClaimStatuses": _by("name"),
    },
    # the status of every other kind with conditions (workloads, namespaces, PVCs, …)
    "Conditions": _CONDITIONS,
    # Deployment, ReplicaSet, StatefulSet, DaemonSet, Job and ReplicationController specs
    "WorkloadSpec": {"template": "PodTemplateSpec"},
    "CronJobSpec": {"jobTemplate": "JobTemplateSpec"},
    "JobTemplateSpec": {"metadata": "ObjectMeta", "spec": "WorkloadSpec"},
    "ServiceSpec": {"ports": _by("port", ssa=("port", "protocol"))},
    "NodeSpec": {"podCIDRs": SET},
    "NodeStatus": {**_CONDITIONS, "addresses": _by("type")},
    "ServiceAccount": {"metadata": "ObjectMeta", "secrets": _by("name")},
}
_OBJECT = "Object"  # any kind's top level: its metadata
TYPES[_OBJECT] = {"metadata": "ObjectMeta"}


def _kind(spec: str | None = None, status: str | None = None) -> dict[str, Meta]:
    out: dict[str, Meta] = {"metadata": "ObjectMeta"}
    if spec:
        out["spec"] = spec
    if status:
        out["status"] = status
    return out


_WORKLOAD = _kind("WorkloadSpec", "Conditions")
# kind -> the type of its top level (every other kind: `_OBJECT`)
ROOTS: dict[str, str] = {}
for _name, _fields in {
    "Pod": _kind("PodSpec", "PodStatus"),
    "Deployment": _WORKLOAD,
    "ReplicaSet": _WORKLOAD,
    "StatefulSet": _WORKLOAD,
    "DaemonSet": _WORKLOAD,
    "Job": _WORKLOAD,
    "ReplicationController": _WORKLOAD,
    "CronJob": _kind("CronJobSpec"),
    "Service": _kind("ServiceSpec", "Conditions"),
    "Node": _kind("NodeSpec", "NodeStatus"),
    "Namespace": _kind(status="Conditions"),
    "PersistentVolumeClaim": _kind(status="Conditions"),
}.items():
    TYPES[_name] = _fields
    ROOTS[_name] = _name
ROOTS["ServiceAccount"] = "ServiceAccount"


def root(kind: str) -> str:
    """The type name of a kind's top level."""
    return ROOTS.get(kind, _OBJECT)


def field_meta(type_name: str | None, field: str) -> Meta | None:
    """What the table says about `field` of `type_name`: a map type, a merge list, or
    None (a plain field: maps merge key by key, lists are atomic)."""
    if type_name is None:
        return None
    return TYPES.get(type_name, {}).get(field)


def map_type(meta: Meta | None) -> str | None:
    return meta if isinstance(meta, str) else None


# -- applying a patch ---------------------------------------------------------------------


def strategic_merge(original: Mapping[str, Any], patch: Mapping[str, Any], kind: str) -> Any:
    """`original` patched by the strategic merge patch `patch` (both left untouched)."""
    return _merge_map(copy.deepcopy(dict(original)), copy.deepcopy(dict(patch)), root(kind))


def _fail(why: str) -> StatusError:
    return bad_request(f"strategic merge patch: {why}")


def _merge_map(original: dict[str, Any] | None, patch: dict[str, Any], t: str | None) -> Any:
    """`patch` merged into `original` (None: a value new to the object), in place."""
    directive = patch.pop(PATCH, _MISSING)
    if directive == "replace":
        return _merge_map(None, patch, t)
    if directive == "delete":
        return {}
    if directive not in (_MISSING, "merge"):
        raise _fail(f"unknown $patch directive {directive!r} in a map")
    out: dict[str, Any] = {} if original is None else original
    for key in patch:
        known = key == RETAIN_KEYS or key.startswith((SET_ORDER, DELETE_FROM))
        if key.startswith("$") and not known:
            raise _fail(f"unknown directive {key!r}")
    if RETAIN_KEYS in patch:
        _retain_keys(out, patch, patch.pop(RETAIN_KEYS))
    for key in [k for k in patch if k.startswith(SET_ORDER)]:
        _set_element_order(out, patch, key, t)
    for key, value in patch.items():
        if key.startswith(DELETE_FROM):
            _delete_from_list(out, key, value, t)
        elif value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            current = out.get(key)
            base = current if isinstance(current, dict) else None
            out[key] = _merge_map(base, value, map_type(field_meta(t, key)))
        elif isinstance(value, list):
            current = out.get(key)
            base_list = current if isinstance(current, list) else []
            out[key] = _merge_list(base_list, value, field_meta(t, key), key)
        else:
            out[key] = value
    return out


def _retain_keys(out: dict[str, Any], patch: Mapping[str, Any], keep: Any) -> None:
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise _fail("$retainKeys must be a list of field names")
    for key, value in patch.items():
        if value is not None and not key.startswith((SET_ORDER, DELETE_FROM)) and key not in keep:
            raise _fail(f"the patch sets {key!r}, which its $retainKeys list does not name")
    for key in [k for k in out if k not in keep]:
        del out[key]


def _delete_from_list(out: dict[str, Any], key: str, values: Any, t: str | None) -> None:
    field = key[len(DELETE_FROM) :]
    if not field:
        raise _fail(f"{key!r} names no list")
    if not isinstance(values, list) or any(isinstance(v, dict | list) for v in values):
        raise _fail(f"{key!r} must be a list of scalar values")
    if field_meta(t, field) != SET:
        raise _fail(f"{key!r}: {field!r} is not a merging list of scalars")
    current = out.get(field)
    if isinstance(current, list):
        out[field] = [v for v in current if not any(json_equal(v, gone) for gone in values)]


def _set_element_order(out: dict[str, Any], patch: dict[str, Any], key: str, t: str | None) -> None:
    """Merge the list `key` orders (if the patch changes it) and put it in that order."""
    order = patch.pop(key)
    field = key[len(SET_ORDER) :]
    if not field:
        raise _fail(f"{key!r} names no list")
    if not isinstance(order, list):
        raise _fail(f"{key!r} must be a list")
    meta = field_meta(t, field)
    if not isinstance(meta, MergeList):
        raise _fail(f"{key!r}: {field!r} is not a merging list")
    current = out.get(field)
    change = patch.pop(field, None)
    if change is not None and not isinstance(change, list):
        raise _fail(f"{field!r} must be a list")
    if not isinstance(current, list) and change is None:
        return
    ident = _identity(meta)
    original: list[Any] = current if isinstance(current, list) else []
    merged = original
    if change is not None:
        _check_order(change, [ident(item) for item in order], ident, meta, key)
        merged = _merge_list(original, change, meta, field)
    out[field] = _reorder(merged, order, original, ident)


def _check_order(
    change: list[Any], wanted: list[Hashable], ident: Ident, meta: MergeList, key: str
) -> None:
    """The patch list's items (deletions aside) appear in `wanted`, in the same order."""
    at = 0
    for item in change:
        if meta.key is not None and isinstance(item, dict) and PATCH in item:
            continue
        value = ident(item)
        while at < len(wanted) and wanted[at] != value:
            at += 1
        if at == len(wanted):
            raise _fail(f"the order of the patch's list does not match {key!r}")
        at += 1


def _merge_list(original: list[Any], patch: list[Any], meta: Meta | None, field: str) -> list[Any]:
    if not isinstance(meta, MergeList):
        return patch  # an atomic list: replaced whole
    if meta.key is None:
        return _merge_set(original, patch, meta, field)
    key = meta.key
    if not all(isinstance(o, dict) for o in original):
        raise _fail(f"the stored {field!r} is not a list of objects: it cannot merge by {key!r}")
    replace = False
    plain: list[dict[str, Any]] = []
    for item in patch:
        if not isinstance(item, dict):
            raise _fail(f"{field!r} merges objects by {key!r}: {item!r} is not an object")
        directive = item.get(PATCH, _MISSING)
        if directive is _MISSING:
            if key not in item:
                raise _fail(f"an element of {field!r} has no merge key {key!r}")
            plain.append(item)
        elif directive == "delete":
            if key not in item:
                raise _fail(f"a $patch: delete element of {field!r} has no merge key {key!r}")
            original = [o for o in original if not json_equal(o.get(key, _MISSING), item[key])]
        elif directive == "replace":
            replace = True
        elif directive != "merge":
            raise _fail(f"unknown $patch directive {directive!r} in {field!r}")
    if replace:
        original = []
    merged = list(original)
    for item in plain:
        at = next(
            (i for i, o in enumerate(merged) if json_equal(o.get(key, _MISSING), item[key])), -1
        )
        if at >= 0:
            merged[at] = _merge_map(merged[at], item, meta.item)
        else:
            merged.append(_merge_map(None, item, meta.item))
    return _reorder(merged, plain, original, _identity(meta))


def _merge_set(original: list[Any], patch: list[Any], meta: MergeList, field: str) -> list[Any]:
    """A merging list of scalars: the union, without duplicates."""
    merged: list[Any] = []
    for value in [*original, *patch]:
        if isinstance(value, dict | list):
            raise _fail(f"{field!r} is a list of scalars, not of {type(value).__name__}s")
        if not any(json_equal(value, m) for m in merged):
            merged.append(value)
    return _reorder(merged, patch, original, _identity(meta))


# -- element order (apimachinery's normalizeElementOrder) ---------------------------------

Ident = Callable[[Any], Hashable]


def _identity(meta: MergeList) -> Ident:
    """What names a list element for ordering: its merge key's value, or itself."""
    key = meta.key

    def ident(item: Any) -> Hashable:
        return _hashable(item.get(key) if key is not None and isinstance(item, dict) else item)

    return ident


def _hashable(value: Any) -> Hashable:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, dict | list):
        return ("json", repr(value))
    return value  # type: ignore[no-any-return]


def _reorder(merged: list[Any], wanted: list[Any], original: list[Any], ident: Ident) -> list[Any]:
    """`merged` in apimachinery's order: the items `wanted` names, in its order,
    interleaved with the others, which keep their `original` order."""
    order = [ident(w) for w in wanted]
    named = {o for o in order if o is not None}
    rank = _first(order)
    listed = sorted((m for m in merged if ident(m) in named), key=lambda m: rank.get(ident(m), 0))
    others = [m for m in merged if ident(m) not in named]
    place = _first([ident(o) for o in original])
    out: list[Any] = []
    i = j = 0
    while i < len(others) or j < len(listed):
        if j < len(listed) and i < len(others):
            # a live item goes first only when both are live and it came first
            li, ri = place.get(ident(others[i])), place.get(ident(listed[j]))
            take_left = li is not None and ri is not None and li < ri
        else:
            take_left = j >= len(listed)
        if take_left:
            out.append(others[i])
            i += 1
        else:
            out.append(listed[j])
            j += 1
    return out


def _first(values: list[Hashable]) -> dict[Hashable, int]:
    """Each value's first position."""
    place: dict[Hashable, int] = {}
    for i, value in enumerate(values):
        place.setdefault(value, i)
    return place


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (80 == 80.0), never a bool equal to a number."""
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, list):
        return (
            isinstance(b, list)
            and len(a) == len(b)
            and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return not isinstance(b, dict | list) and _hashable(a) == _hashable(b)

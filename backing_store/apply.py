"""Server-side apply and `metadata.managedFields` (DESIGN §10).

Every write records who set which fields, as Kubernetes does, in
`metadata.managedFields`: one entry per field manager and operation, `{manager,
operation: Apply|Update, apiVersion, time, fieldsType: FieldsV1, fieldsV1}`, the
fields in Kubernetes' FieldsV1 shape (`f:<field>`, `k:<key fields as JSON>` for an
item of a keyed list, `v:<value>` for a member of a set list, `.` for an item owned
itself). The manager is the `fieldManager` query parameter, else the client's
User-Agent up to its first `/` (`kubectl-create`, `kubectl-edit`, `Python`, …). What a
client sends in `managedFields` is ignored: they are the store's own.

- An Update (create, PUT, a JSON/merge/strategic patch) gives its manager the fields it
  changed and takes them from every other manager.
- An Apply (`PATCH`, `Content-Type: application/apply-patch+yaml`, `fieldManager`
  required) says "these fields, with these values, are mine": the body is the whole
  intended object. A field it sets to a value other than the live one, while another
  manager owns that field, is a conflict: 409 `Status` (reason `Conflict`, one
  `FieldManagerConflict` cause per field, worded as Kubernetes words them) unless
  `force=true`, which moves those fields to the applier. Then the body merges into the
  live object (maps key by key, keyed lists item by item, set lists as unions, other
  lists replaced), fields the applier owned before and no longer names are removed
  (unless another manager owns them too), and the applier owns exactly what it named.
  A missing object is created from the body. An apply that changes nothing stores
  nothing.

Which lists are keyed (and by which fields) or sets comes from the one table of list
semantics, `strategic.TYPES`; `null` values in an apply body are left out, as if not
named. Fields no manager owns: `apiVersion`, `kind`, and the metadata the store sets
(`name`, `namespace`, `tenant`, `uid`, `resourceVersion`, `creationTimestamp`,
`generation`, `managedFields`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from .errors import StatusError, bad_request
from .strategic import MergeList, field_meta, json_equal, map_type, root

Path = tuple[str, ...]  # FieldsV1 keys from the top: ("f:spec", "f:containers", 'k:{"name":"a"}')
Obj = dict[str, Any]

APPLY = "Apply"
UPDATE = "Update"
FIELDS_V1 = "FieldsV1"
MAX_MANAGER = 128
_MISSING: Final = object()
# Set by the store, never owned (Kubernetes strips the same, and `tenant` is ours).
_UNOWNED: frozenset[Path] = frozenset(
    {("f:apiVersion",), ("f:kind",)}
    | {
        ("f:metadata", f"f:{name}")
        for name in (
            "name",
            "namespace",
            "tenant",
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
            "selfLink",
        )
    }
)


# -- request options ----------------------------------------------------------------------


def field_manager(request: web.Request, *, apply: bool) -> str:
    """The request's field manager: `fieldManager`, else the User-Agent's product name.
    422 as in Kubernetes for one that is missing on an apply, too long or unprintable."""
    name = request.query.get("fieldManager")
    if name is None or name == "":
        if apply:
            raise _invalid_option("fieldManager", "Required value: is required for apply patch")
        agent = request.headers.get("User-Agent", "").split("/", 1)[0]
        return agent[:MAX_MANAGER] or "unknown"
    if len(name) > MAX_MANAGER:
        raise _invalid_option("fieldManager", f"Too long: may not be more than {MAX_MANAGER} bytes")
    if not name.isprintable():
        raise _invalid_option(
            "fieldManager", "Invalid value: must only contain printable characters"
        )
    return name


def force(request: web.Request) -> bool:
    """`force` of an apply: true/false (kubectl always sends it); 400 otherwise."""
    text = request.query.get("force", "false")
    if text.lower() in ("true", "1", "t"):
        return True
    if text.lower() in ("false", "0", "f", ""):
        return False
    raise bad_request(f"force must be true or false, not {text!r}")


def refuse_force(request: web.Request) -> None:
    """`force` belongs to apply only: Kubernetes refuses it on other patches (422)."""
    if "force" in request.query:
        raise _invalid_option("force", "Forbidden: may not be specified for non-apply patch")


def _invalid_option(option: str, why: str) -> StatusError:
    reason = "FieldValueRequired" if why.startswith("Required") else "FieldValueInvalid"
    return StatusError(
        422,
        f'PatchOptions.meta.k8s.io "" is invalid: {option}: {why}',
        details={
            "group": "meta.k8s.io",
            "kind": "PatchOptions",
            "causes": [{"reason": reason, "message": why, "field": option}],
        },
    )


# -- field sets -------------------------------------------------------------------------


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fields_of(obj: Mapping[str, Any], kind: str) -> set[Path]:
    """Every field of `obj` that can be owned: leaves, keyed-list items, set members."""
    out: set[Path] = set()
    _walk_map(obj, root(kind), (), out)
    return out


def _walk_map(value: Mapping[str, Any], t: str | None, prefix: Path, out: set[Path]) -> None:
    if not value and prefix:
        out.add(prefix)  # an empty map is a value of its own
        return
    for key, item in value.items():
        path = (*prefix, f"f:{key}")
        if path in _UNOWNED:
            continue
        meta = field_meta(t, key)
        if isinstance(item, dict):
            _walk_map(item, map_type(meta), path, out)
        elif isinstance(item, list):
            _walk_list(item, meta, path, out)
        else:
            out.add(path)


def _walk_list(items: list[Any], meta: Any, prefix: Path, out: set[Path]) -> None:
    keys = _item_keys(items, meta)
    if keys is None:
        out.add(prefix)  # an atomic list is one value
        return
    for item, key in zip(items, keys, strict=True):
        path = (*prefix, key)
        out.add(path)
        if isinstance(item, dict):
            for name, sub in item.items():
                sub_path = (*path, f"f:{name}")
                item_type = meta.item if isinstance(meta, MergeList) else None
                sub_meta = field_meta(item_type, name)
                if isinstance(sub, dict):
                    _walk_map(sub, map_type(sub_meta), sub_path, out)
                elif isinstance(sub, list):
                    _walk_list(sub, sub_meta, sub_path, out)
                else:
                    out.add(sub_path)


def _item_keys(items: list[Any], meta: Any) -> list[str] | None:
    """The FieldsV1 key of each item of a keyed or set list; None: the list is atomic
    (so it is, too, when its items do not fit: no key field, or the same key twice)."""
    if not isinstance(meta, MergeList):
        return None
    if meta.key is None:
        if any(isinstance(v, dict | list) for v in items):
            return None
        keys = [f"v:{_canonical(v)}" for v in items]
    else:
        if not all(isinstance(v, dict) and meta.key in v for v in items):
            return None
        keys = [_key_of(v, meta) for v in items]
    return keys if len(set(keys)) == len(keys) else None


def _key_of(item: Mapping[str, Any], meta: MergeList) -> str:
    return "k:" + _canonical({k: item[k] for k in meta.ssa_keys if k in item})


def _value_at(obj: Any, path: Path) -> Any:
    node = obj
    for part in path:
        kind, _, rest = part.partition(":")
        if kind == "f" and isinstance(node, dict) and rest in node:
            node = node[rest]
        elif kind == "k" and isinstance(node, list):
            want = json.loads(rest)
            node = next((i for i in node if _matches(i, want)), _MISSING)
        elif kind == "v" and isinstance(node, list):
            value = json.loads(rest)
            node = True if any(json_equal(v, value) for v in node) else _MISSING
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def _matches(item: Any, key: Mapping[str, Any]) -> bool:
    return isinstance(item, dict) and all(
        k in item and json_equal(item[k], v) for k, v in key.items()
    )


def _is_leaf(path: Path) -> bool:
    return path[-1].startswith("f:")


def _changed(old: Any, new: Any, path: Path) -> bool:
    """Whether the field at `path` (present in `new`) differs in `old`."""
    before = _value_at(old, path)
    if before is _MISSING:
        return True
    return _is_leaf(path) and not json_equal(before, _value_at(new, path))


# -- FieldsV1 ---------------------------------------------------------------------------


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    members = set(paths)
    for path in sorted(members):
        node = tree
        for part in path:
            node = node.setdefault(part, {})
    for path in members:
        node = tree
        for part in path:
            node = node[part]
        if node and "." not in node:
            node["."] = {}
    return tree


def from_fields_v1(tree: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(tree, dict):
        return out
    for key, sub in tree.items():
        if key == ".":
            if prefix:
                out.add(prefix)
        elif isinstance(key, str) and _valid_key(key):
            path = (*prefix, key)
            if isinstance(sub, dict) and sub:
                out |= from_fields_v1(sub, path)
            else:
                out.add(path)
    return out


def _valid_key(key: str) -> bool:
    """A FieldsV1 key the store can follow (entries stored before the store kept its
    own managedFields may hold anything)."""
    kind, _, rest = key.partition(":")
    if kind in ("f", "i"):
        return True
    if kind not in ("k", "v"):
        return False
    try:
        value = json.loads(rest)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) if kind == "k" else True


def path_text(path: Path) -> str:
    """A path as Kubernetes prints it: `.spec.containers[name="a"].image`."""
    text = ""
    for part in path:
        kind, _, rest = part.partition(":")
        if kind == "f":
            text += f".{rest}"
        elif kind == "k":
            pairs = json.loads(rest)
            text += "[" + ",".join(f"{k}={_canonical(v)}" for k, v in pairs.items()) + "]"
        elif kind == "v":
            text += f"[={rest}]"
        else:
            text += f"[{rest}]"
    return text


# -- managers ---------------------------------------------------------------------------


@dataclass(slots=True)
class Manager:
    manager: str
    operation: str
    api_version: str
    time: str
    fields: set[Path] = field(default_factory=set)
    subresource: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.subresource)

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": FIELDS_V1,
            "fieldsV1": to_fields_v1(self.fields),
        }
        if self.subresource:
            out["subresource"] = self.subresource
        return out

    def described(self) -> str:
        """How a conflict names this manager (apimachinery's printManager)."""
        text = json.dumps(self.manager, ensure_ascii=False)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == UPDATE:
            text += f" using {self.api_version}"
            if self.time:
                text += f" at {self.time}"
        return text


def managers_of(obj: Mapping[str, Any] | None) -> list[Manager]:
    """The managers recorded on a stored object (entries that do not parse are dropped)."""
    meta = obj.get("metadata") if obj else None
    entries = meta.get("managedFields") if isinstance(meta, dict) else None
    out: list[Manager] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name, operation = entry.get("manager"), entry.get("operation")
        if not isinstance(name, str) or operation not in (APPLY, UPDATE):
            continue
        sub = entry.get("subresource")
        out.append(
            Manager(
                name,
                operation,
                str(entry.get("apiVersion") or ""),
                str(entry.get("time") or ""),
                from_fields_v1(entry.get("fieldsV1")),
                sub if isinstance(sub, str) else "",
            )
        )
    return out


def _store_managers(obj: Obj, managers: list[Manager], present: set[Path]) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    entries = []
    for m in managers:
        m.fields &= present
        if m.fields:
            entries.append(m.entry())
    if entries:
        meta["managedFields"] = entries
    else:
        meta.pop("managedFields", None)


def forget_client_fields(obj: Obj) -> None:
    """Drop a client's `metadata.managedFields`: the store keeps its own."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


def record_update(
    old: Obj | None,
    new: Obj,
    kind: str,
    manager: str,
    api_version: str,
    time: str,
    subresource: str = "",
) -> None:
    """Set `new`'s managedFields after an Update by `manager` from `old` (None: a create)."""
    managers = managers_of(old)
    present = fields_of(new, kind)
    changed = {p for p in present if old is None or _changed(old, new, p)}
    me = (manager, UPDATE, subresource)
    mine = next((m for m in managers if m.key == me), None)
    for m in managers:
        if m is not mine:
            m.fields -= changed
    if changed:
        if mine is None:
            mine = Manager(manager, UPDATE, api_version, time, subresource=subresource)
            managers.append(mine)
        mine.fields |= changed
        mine.api_version, mine.time = api_version, time
    _store_managers(new, managers, present)


# -- apply ------------------------------------------------------------------------------


def apply(
    live: Obj | None,
    applied: Obj,
    kind: str,
    manager: str,
    api_version: str,
    time: str,
    *,
    force: bool,
) -> Obj:
    """The object after `manager` applies `applied` to `live` (None: create it), with its
    managedFields; 409 for conflicts unless `force`. Neither argument is changed."""
    config = _without_nulls(applied)
    forget_client_fields(config)
    named = fields_of(config, kind)
    managers = managers_of(live)
    me = (manager, APPLY, "")
    conflicts = [
        (m, p)
        for m in managers
        if m.key != me
        for p in sorted(named & m.fields)
        if _is_leaf(p) and not json_equal(_value_at(config, p), _value_at(live, p))
    ]
    if conflicts and not force:
        raise conflict_error(conflicts)
    for m, p in conflicts:
        m.fields.discard(p)
    mine = next((m for m in managers if m.key == me), None)
    result: Obj = copy.deepcopy(live) if live else {}
    forget_client_fields(result)
    if mine is not None:
        others = set().union(*(m.fields for m in managers if m is not mine))
        removed: list[Path] = []
        for path in sorted(mine.fields - named, key=len):
            if any(path[: len(r)] == r for r in removed):
                continue  # inside an item already removed
            if not any(o[: len(path)] == path for o in others):
                _remove(result, path)
                removed.append(path)
    else:
        mine = Manager(manager, APPLY, api_version, time)
        managers.append(mine)
    result = _merge(result, config, root(kind))
    mine.fields, mine.api_version, mine.time = named, api_version, time
    _store_managers(result, managers, fields_of(result, kind))
    if live is not None and _same_but_times(live, result):
        return copy.deepcopy(live)
    return result


def conflict_error(conflicts: list[tuple[Manager, Path]]) -> StatusError:
    """409 as apimachinery's NewConflictError words it."""
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {m.described()}",
            "field": path_text(p),
        }
        for m, p in conflicts
    ]
    if len(conflicts) == 1:
        m, p = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {m.described()}: {path_text(p)}"
    else:
        by_manager: dict[str, list[str]] = {}
        for m, p in conflicts:
            by_manager.setdefault(m.described(), []).append(path_text(p))
        lines = []
        for name in sorted(by_manager):
            lines.append(f"conflicts with {name}:")
            lines += [f"- {p}" for p in by_manager[name]]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return StatusError(409, message, "Conflict", details={"causes": causes})


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _remove(obj: Obj, path: Path) -> None:
    """Remove the field at `path`, and the maps its removal leaves empty."""
    chain: list[tuple[Any, str]] = []
    node: Any = obj
    for part in path[:-1]:
        chain.append((node, part))
        node = _value_at(node, (part,))
        if node is _MISSING:
            return
    kind, _, rest = path[-1].partition(":")
    if kind == "f" and isinstance(node, dict):
        node.pop(rest, None)
    elif kind == "k" and isinstance(node, list):
        want = json.loads(rest)
        node[:] = [i for i in node if not _matches(i, want)]
    elif kind == "v" and isinstance(node, list):
        value = json.loads(rest)
        node[:] = [v for v in node if not json_equal(v, value)]
    for parent, part in reversed(chain):
        if node or not part.startswith("f:") or not isinstance(parent, dict):
            break
        parent.pop(part[2:], None)
        node = parent


def _merge(live: Any, config: Any, t: str | None) -> Any:
    """`config` merged into `live` (maps key by key, keyed lists by item, sets by union)."""
    if not isinstance(config, dict):
        return copy.deepcopy(config)
    out = live if isinstance(live, dict) else {}
    for key, value in config.items():
        meta = field_meta(t, key)
        if isinstance(value, dict):
            out[key] = _merge(out.get(key), value, map_type(meta))
        elif isinstance(value, list):
            out[key] = _merge_list(out.get(key), value, meta)
        else:
            out[key] = value
    return out


def _merge_list(live: Any, config: list[Any], meta: Any) -> list[Any]:
    keys = _item_keys(config, meta)
    live_keys = _item_keys(live, meta) if isinstance(live, list) else None
    if keys is None or live_keys is None or not isinstance(live, list):
        return copy.deepcopy(config)
    merged = list(live)
    item_type = meta.item if isinstance(meta, MergeList) else None
    for item, key in zip(config, keys, strict=True):
        if key in live_keys:
            at = live_keys.index(key)
            merged[at] = _merge(merged[at], item, item_type)
        else:
            merged.append(copy.deepcopy(item))
    return merged


def _same_but_times(live: Obj, result: Obj) -> bool:
    """`result` is `live` but for the times of its managedFields entries."""

    def untimed(obj: Obj) -> Obj:
        out = dict(obj)
        meta = dict(out.get("metadata") or {})
        entries = meta.get("managedFields")
        if isinstance(entries, list):
            meta["managedFields"] = [
                {k: v for k, v in e.items() if k != "time"} if isinstance(e, dict) else e
                for e in entries
            ]
        out["metadata"] = meta
        return out

    return json_equal(untimed(live), untimed(result))

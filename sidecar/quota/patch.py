"""The object an update or patch will leave in the store, so its charge can be computed.

DESIGN §7: a PUT replaces the object with its body; a PATCH is applied to the object
read fresh from the store. Patch types, by `Content-Type`:
- `application/merge-patch+json`, `application/json`, or no `Content-Type` at all:
  RFC 7386 JSON merge patch (as the reference store reads them);
- `application/strategic-merge-patch+json`: treated as a merge patch (lists are
  replaced whole, as the reference store does; for the fields the meters read —
  `spec.replicas`, containers' `resources.requests` — a strategic merge keyed by
  container name can only differ when containers are added or removed by name);
- `application/json-patch+json`: RFC 6902 (add, remove, replace, move, copy, test);
- anything else on a metered resource → 415.
A patch that does not apply is a PatchError (400 malformed, 422 a failed `test` or a
path that does not exist), answered before anything is reserved or forwarded.
"""

from __future__ import annotations

import copy
from typing import Any

from sidecar.errors import StatusError

MERGE = "merge"
JSON_PATCH = "json-patch"
PATCH_TYPES = {
    "application/merge-patch+json": MERGE,
    "application/json": MERGE,
    "application/strategic-merge-patch+json": MERGE,
    "application/json-patch+json": JSON_PATCH,
}


class PatchError(StatusError):
    pass


def patch_kind(content_type: str | None) -> str:
    """The patch type of a PATCH request (`None`: no Content-Type); 415 for one the
    sidecar cannot apply."""
    if content_type is None:
        return MERGE
    kind = PATCH_TYPES.get(content_type)
    if kind is None:
        raise StatusError(
            415,
            f"PATCH of a quota-tracked resource takes a JSON merge patch "
            f"(application/merge-patch+json) or a JSON patch (application/json-patch+json), "
            f"not {content_type!r}",
        )
    return kind


def updated_object(method: str, kind: str, current: Any, body: Any) -> dict[str, Any]:
    """The object after a PUT (`body`) or a PATCH of `kind` applied to `current`."""
    if method == "PUT":
        new = body
    elif kind == JSON_PATCH:
        new = apply_json_patch(current, body)
    else:
        new = merge_patch(current, body)
    if not isinstance(new, dict):
        raise PatchError(400, "the updated object is not a JSON object")
    return new


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


_MISSING = object()


def apply_json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch; all or nothing (the input is not modified)."""
    if not isinstance(ops, list):
        raise PatchError(400, "a JSON patch must be a JSON array of operations")
    doc = copy.deepcopy(doc)
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise PatchError(400, f"JSON patch operation {i} is not an object with an 'op'")
        name = op["op"]
        path = _pointer(op, "path", i)
        if name in ("add", "replace", "test"):
            if "value" not in op:
                raise PatchError(400, f"JSON patch operation {i} ({name}) needs a 'value'")
            value = copy.deepcopy(op["value"])
        if name == "add":
            doc = _add(doc, path, value, i)
        elif name == "remove":
            doc, _ = _remove(doc, path, i)
        elif name == "replace":
            doc, _ = _remove(doc, path, i)
            doc = _add(doc, path, value, i)
        elif name in ("move", "copy"):
            source = _pointer(op, "from", i)
            if name == "move":
                if path[: len(source)] == source and len(path) > len(source):
                    raise PatchError(
                        400, f"JSON patch operation {i}: cannot move a value into itself"
                    )
                doc, moved = _remove(doc, source, i)
            else:
                moved = copy.deepcopy(_get(doc, source, i))
            doc = _add(doc, path, moved, i)
        elif name == "test":
            if _get(doc, path, i) != value:
                raise PatchError(422, f"JSON patch operation {i} (test) failed")
        else:
            raise PatchError(400, f"JSON patch operation {i}: unknown op {name!r}")
    return doc


def _pointer(op: dict[str, Any], key: str, i: int) -> list[str]:
    raw = op.get(key)
    if not isinstance(raw, str) or (raw and not raw.startswith("/")):
        raise PatchError(400, f"JSON patch operation {i}: {key!r} is not a JSON pointer")
    if raw == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in raw[1:].split("/")]


def _index(container: list[Any], token: str, i: int, *, adding: bool) -> int:
    if adding and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(422, f"JSON patch operation {i}: {token!r} is not an array index")
    index = int(token)
    if index > len(container) or (index == len(container) and not adding):
        raise PatchError(422, f"JSON patch operation {i}: index {index} is out of range")
    return index


def _parent(doc: Any, path: list[str], i: int) -> Any:
    return _get(doc, path[:-1], i)


def _get(doc: Any, path: list[str], i: int) -> Any:
    node = doc
    for token in path:
        if isinstance(node, dict):
            node = node.get(token, _MISSING)
        elif isinstance(node, list):
            node = node[_index(node, token, i, adding=False)]
        else:
            node = _MISSING
        if node is _MISSING:
            raise PatchError(
                422, f"JSON patch operation {i}: path /{'/'.join(path)} does not exist"
            )
    return node


def _add(doc: Any, path: list[str], value: Any, i: int) -> Any:
    if not path:
        return value
    parent = _parent(doc, path, i)
    token = path[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, i, adding=True), value)
    else:
        raise PatchError(422, f"JSON patch operation {i}: cannot add under a scalar")
    return doc


def _remove(doc: Any, path: list[str], i: int) -> tuple[Any, Any]:
    if not path:
        return None, doc
    parent = _parent(doc, path, i)
    token = path[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(
                422, f"JSON patch operation {i}: path /{'/'.join(path)} does not exist"
            )
        return doc, parent.pop(token)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, token, i, adding=False))
    raise PatchError(422, f"JSON patch operation {i}: path /{'/'.join(path)} does not exist")

"""PATCH bodies: RFC 7386 JSON merge patch and RFC 6902 JSON patch.

`application/merge-patch+json`, `application/strategic-merge-patch+json` (applied as a
merge patch: the store's objects have no patch strategies), plain `application/json`
and a body without `Content-Type` are merge patches; `application/json-patch+json` is
a JSON patch. A malformed JSON patch is 400; one that does not apply (a missing path,
a failed `test`) is 422, as in Kubernetes.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import StatusError, bad_request

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH_TYPES = frozenset(
    {"application/merge-patch+json", "application/strategic-merge-patch+json", "application/json"}
)
_OPS = {"add", "remove", "replace", "move", "copy", "test"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902: apply `ops` to a copy of `doc`."""
    if not isinstance(ops, list):
        raise bad_request("a JSON patch must be a JSON array of operations")
    doc = copy.deepcopy(doc)
    for n, op in enumerate(ops):
        if not isinstance(op, dict) or op.get("op") not in _OPS:
            raise bad_request(f"JSON patch operation {n}: 'op' must be one of {sorted(_OPS)}")
        path = _pointer(op.get("path"), n, "path")
        kind = op["op"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"JSON patch operation {n} ({kind}) needs a 'value'")
        if kind == "test":
            if _get(doc, path, n) != op["value"]:
                raise _unprocessable(n, f"test of {op['path']!r} failed")
        elif kind == "remove":
            doc = _remove(doc, path, n)
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]), n)
        elif kind == "replace":
            doc = _remove(doc, path, n)
            doc = _add(doc, path, copy.deepcopy(op["value"]), n)
        else:
            source = _pointer(op.get("from"), n, "from")
            value = copy.deepcopy(_get(doc, source, n))
            if kind == "move":
                if path[: len(source)] == source and len(path) > len(source):
                    raise _unprocessable(n, "cannot move a value into itself")
                doc = _remove(doc, source, n)
            doc = _add(doc, path, value, n)
    return doc


def _unprocessable(n: int, why: str) -> StatusError:
    return StatusError(422, f"JSON patch operation {n} does not apply: {why}")


def _pointer(text: object, n: int, field: str) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise bad_request(f"JSON patch operation {n}: {field!r} must be a JSON pointer")
    if not text:
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]


def _index(container: list[Any], token: str, n: int, *, append: bool) -> int:
    if append and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise _unprocessable(n, f"{token!r} is not an array index")
    i = int(token)
    if i > len(container) or (i == len(container) and not append):
        raise _unprocessable(n, f"array index {i} is out of range")
    return i


def _parent(doc: Any, path: list[str], n: int) -> Any:
    node = doc
    for token in path[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, n, append=False)]
        else:
            raise _unprocessable(n, f"path /{'/'.join(path)} does not exist")
    return node


def _get(doc: Any, path: list[str], n: int) -> Any:
    if not path:
        return doc
    parent, token = _parent(doc, path, n), path[-1]
    if isinstance(parent, dict) and token in parent:
        return parent[token]
    if isinstance(parent, list):
        return parent[_index(parent, token, n, append=False)]
    raise _unprocessable(n, f"path /{'/'.join(path)} does not exist")


def _add(doc: Any, path: list[str], value: Any, n: int) -> Any:
    if not path:
        return value
    parent, token = _parent(doc, path, n), path[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, n, append=True), value)
    else:
        raise _unprocessable(n, f"path /{'/'.join(path)} has no container")
    return doc


def _remove(doc: Any, path: list[str], n: int) -> Any:
    if not path:
        return None
    parent, token = _parent(doc, path, n), path[-1]
    if isinstance(parent, dict) and token in parent:
        del parent[token]
    elif isinstance(parent, list):
        del parent[_index(parent, token, n, append=False)]
    else:
        raise _unprocessable(n, f"path /{'/'.join(path)} does not exist")
    return doc

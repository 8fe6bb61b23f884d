"""PATCH bodies other than server-side apply (`apply.py`): which patch a `Content-Type`
means, and applying it.

- `application/strategic-merge-patch+json` (kubectl's default): `strategic.py`, with
  the Kubernetes patch merge keys and directives.
- `application/merge-patch+json`, and (for curl) plain `application/json` or no
  `Content-Type`: RFC 7386 JSON merge patch (`merge_patch`).
- `application/json-patch+json`: RFC 6902 JSON patch, through the `jsonpatch` library.
  A malformed patch (not a list of operations, an unknown `op`, a missing `path`,
  `value` or `from`, a `path` that is not a JSON pointer) is 400; one that does not
  apply (a missing path, a failed `test`, a bad array index) is 422, as in Kubernetes.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer

from .errors import StatusError, bad_request
from .strategic import strategic_merge

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def apply_patch(content_type: str, current: dict[str, Any], body: Any, kind: str) -> Any:
    """`current` (left untouched) patched by `body`, a patch of `content_type`."""
    if content_type == JSON_PATCH:
        return json_patch(current, body)
    if not isinstance(body, dict):
        raise bad_request("a merge patch must be a JSON object")
    if content_type == STRATEGIC_MERGE_PATCH:
        return strategic_merge(current, body, kind)
    return merge_patch(copy.deepcopy(current), body)


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
    """RFC 6902: `ops` applied to a copy of `doc`."""
    if not isinstance(ops, list):
        raise bad_request("a JSON patch must be a JSON array of operations")
    for n, op in enumerate(ops):
        if not isinstance(op, dict):
            raise bad_request(f"JSON patch operation {n} is not a JSON object")
    try:
        patch = jsonpatch.JsonPatch(ops)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise bad_request(f"invalid JSON patch: {exc}") from None
    try:
        return patch.apply(doc)
    except jsonpatch.InvalidJsonPatch as exc:
        raise bad_request(f"invalid JSON patch: {exc}") from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise StatusError(422, f"the JSON patch does not apply: {exc}") from None

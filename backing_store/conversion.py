"""What the store does to an object of a given kind before storing it, as a Kubernetes
API server's conversion does (DESIGN §10).

Every kind: an empty `metadata.labels`, `annotations`, `finalizers` or `ownerReferences`
is not kept, as the typed round trip of a Kubernetes API server drops it (`omitempty` on
ObjectMeta). Kept, the `"annotations": {}` that `kubectl diff` and client-side
`kubectl apply` patch in would show as a change where there is none.

Secrets: `stringData` is write-only. Each of its keys is copied into `data`,
base64-encoded (overwriting a key of the same name), and `stringData` itself is never
stored or answered. `stringData` must be a map of strings and every `data` value a
base64 string (400 otherwise: Kubernetes cannot decode it either).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from .errors import bad_request

# ObjectMeta's collections, all `omitempty` in the Kubernetes API types.
_OMIT_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences")


def convert(kind: str, obj: dict[str, Any]) -> None:
    """Convert `obj` (of `kind`) in place into what the store keeps."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for key in _OMIT_EMPTY:
            if meta.get(key) in ({}, []):
                del meta[key]
    if kind == "Secret":
        _secret(obj)


def _secret(obj: dict[str, Any]) -> None:
    data = obj.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise bad_request("data must be a map of base64 strings")
    for key, value in data.items():
        if not isinstance(value, str):
            raise bad_request(f"data[{key!r}] must be a base64 string")
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"data[{key!r}] is not valid base64") from None
    plain = obj.pop("stringData", None)
    if plain is None:
        return
    if not isinstance(plain, dict) or not all(isinstance(v, str) for v in plain.values()):
        raise bad_request("stringData must be a map of strings")
    for key, value in plain.items():
        data[key] = base64.b64encode(value.encode("utf-8")).decode("ascii")
    obj["data"] = data

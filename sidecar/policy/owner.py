"""Owner rules (`when: owner`, Ironic node owners): everything that touches objects.

Owns reading an owner field out of an object, the owner lookup through the upstream
(a GET the sidecar makes itself, cached briefly in a bounded TTL cache keyed by the
caller's tenant so one tenant never sees another's entry), the owner filter for list
responses, and the body checks for create (owner defaulted or must be the caller's
tenant) and update/patch (the owner may not change). The policy side (which grant
is an owner grant) lives in the engine; this module never imports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from cachetools import TTLCache

from sidecar.context import Identity
from sidecar.errors import StatusError, forbidden, not_found
from sidecar.target import RequestTarget, Scope

_MISSING = object()


def owner_value(obj: Any, field: str) -> str | None:
    """The owner at a dotted path, or None when missing, null, not a string, or when
    the path runs through something that is not a mapping."""
    node: Any = obj
    for part in field.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node if isinstance(node, str) else None


def _raw_at(obj: Any, parts: list[str]) -> Any:
    """The value at a path, `_MISSING` if absent, or raises ValueError on a non-mapping
    in the middle."""
    node: Any = obj
    for part in parts:
        if not isinstance(node, dict):
            raise ValueError(part)
        if part not in node:
            return _MISSING
        node = node[part]
    return node


def item_path(target: RequestTarget) -> str:
    """The URL of the object a target addresses (its parent object for subresources)."""
    prefix = f"/apis/{target.api_group}/{target.api_version}" if target.api_group else (
        f"/api/{target.api_version}"
    )
    res, name = quote(target.resource, safe=""), quote(target.name, safe="")
    if target.scope == Scope.NAMESPACE:
        return f"{prefix}/tenants/{target.tenant}/namespaces/{target.namespace}/{res}/{name}"
    if target.scope == Scope.TENANT:
        return f"{prefix}/tenants/{target.tenant}/{res}/{name}"
    return f"{prefix}/{res}/{name}"


GetJson = Callable[..., Any]


class OwnerLookup:
    """Owner reads through the upstream with a short, bounded, tenant-keyed cache."""

    def __init__(self, maxsize: int, ttl: float) -> None:
        self._cache: TTLCache[tuple[str, str], dict[str, Any]] | None = (
            TTLCache(maxsize=maxsize, ttl=ttl) if maxsize > 0 and ttl > 0 else None
        )

    async def fetch(
        self, get_json: GetJson, identity: Identity, target: RequestTarget, request_id: str = ""
    ) -> dict[str, Any]:
        """The stored object (only as a mapping); 404 if it does not exist, 503 if the
        upstream fails, so an owner decision is never made without the owner."""
        path = item_path(target)
        key = (identity.tenant, path)
        if self._cache is not None:
            hit = self._cache.get(key)
            if hit is not None:
                return hit
        try:
            status, body = await get_json(path, identity, request_id=request_id)
        except StatusError as exc:
            raise StatusError(
                503, f"cannot check the owner of {target.resource} {target.name!r}: "
                f"{exc.message}"
            ) from None
        if status == 404:
            raise not_found(target.resource, target.name)
        if status != 200:
            raise StatusError(
                503, f"cannot check the owner of {target.resource} {target.name!r}: "
                f"the upstream answered {status}"
            )
        obj = body if isinstance(body, dict) else {}
        if self._cache is not None:
            self._cache[key] = obj
        return obj

    def forget(self, identity: Identity, target: RequestTarget) -> None:
        if self._cache is not None:
            self._cache.pop((identity.tenant, item_path(target)), None)


def list_filter(tenant: str, field: str) -> Callable[[int, bytes], bytes]:
    """A response filter keeping only list items whose owner is `tenant`. A 2xx body
    that is not a JSON list comes back as an empty list: never unfiltered."""

    def apply(status: int, body: bytes) -> bytes:
        if not 200 <= status < 300:
            return body
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
            return json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {},
                               "items": []}).encode()
        doc["items"] = [i for i in doc["items"] if owner_value(i, field) == tenant]
        return json.dumps(doc).encode()

    return apply


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        raise StatusError(400, "the request body is not valid JSON") from None


def check_create(raw: bytes, tenant: str, field: str) -> bytes:
    """Restricted create: the owner must be `tenant` or empty (then set to `tenant`)."""
    body = _json_body(raw)
    if not isinstance(body, dict):
        raise StatusError(400, "the request body must be a JSON object")
    parts = field.split(".")
    try:
        value = _raw_at(body, parts)
    except ValueError:
        raise forbidden(f"{field} has the wrong shape: {'.'.join(parts[:-1])} must be "
                        "an object") from None
    if value is _MISSING or value is None or value == "":
        node = body
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
                node[part] = nxt
            node = nxt
        node[parts[-1]] = tenant
        return json.dumps(body).encode()
    if value != tenant:
        raise forbidden(f"{field} must be your tenant {tenant!r} or empty, not "
                        f"{json.dumps(value)}: only unrestricted callers may set another owner")
    return raw


def check_update(raw: bytes, tenant: str, field: str, content_type: str, method: str) -> bytes:
    """Update/patch through an owner rule: the owner field may not change."""
    body = _json_body(raw)
    parts = field.split(".")
    refused = forbidden(f"{field} cannot be changed through an owner rule: owners cannot "
                        "give objects away")
    if method == "PATCH" and "json-patch" in content_type:
        if not isinstance(body, list):
            raise StatusError(400, "a JSON patch must be a list of operations")
        pointer = "/" + "/".join(parts)
        for op in body:
            if not isinstance(op, dict):
                raise StatusError(400, "a JSON patch operation must be an object")
            for key in ("path", "from"):
                p = op.get(key)
                if not isinstance(p, str):
                    continue
                touches = p == pointer or pointer.startswith(p.rstrip("/") + "/") or p == ""
                if not touches:
                    continue
                if key == "path" and op.get("op") in ("add", "replace", "test") \
                        and p == pointer and op.get("value") == tenant:
                    continue
                if key == "path" and op.get("op") == "test":
                    continue
                raise refused
        return raw
    if not isinstance(body, dict):
        raise StatusError(400, "the request body must be a JSON object")
    try:
        value = _raw_at(body, parts)
    except ValueError:
        raise refused from None
    if method == "PATCH":
        # Merge patch: absent leaves the owner as is; anything else must keep it.
        if value is _MISSING or value == tenant:
            return raw
        raise refused
    if value == tenant:
        return raw
    if value is _MISSING:
        return check_create(raw, tenant, field)
    raise refused

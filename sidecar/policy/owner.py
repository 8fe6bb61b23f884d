"""Owner rules (`when: owner`, Ironic node owners): everything that touches objects.

Owns reading an owner field out of an object, the owner lookup through the upstream
(a GET the sidecar makes itself; reads may use a bounded TTL cache keyed by the
caller's tenant so one tenant never sees another's entry, writes always read fresh;
a miss is cached like a find, so an object the caller does not own and a missing one
take the same path and the same time: no existence oracle by timing, DESIGN §5),
the owner filter for list responses (`list_filter`: which items and Table rows pass,
item by item; the streaming itself is sidecar/services/listfilter.py's), and the body rule
for writes under a grant that is not cluster-wide (`enforce_owner`: the owner is the
caller's tenant, filled in when empty). The policy side (which grant applies, which
fields carry an owner) lives in the engine; this module never imports it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from cachetools import TTLCache
from jsonpointer import JsonPointer, JsonPointerException

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError, forbidden
from sidecar.core.target import RequestTarget, Scope

_MISSING = object()
# A cached miss: the object does not exist.
_ABSENT: dict[str, Any] = {}


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
    prefix = (
        f"/apis/{target.api_group}/{target.api_version}"
        if target.api_group
        else (f"/api/{target.api_version}")
    )
    res, name = quote(target.resource, safe=""), quote(target.name, safe="")
    if target.scope == Scope.NAMESPACE:
        return f"{prefix}/tenants/{target.tenant}/namespaces/{target.namespace}/{res}/{name}"
    if target.scope == Scope.TENANT:
        return f"{prefix}/tenants/{target.tenant}/{res}/{name}"
    return f"{prefix}/{res}/{name}"


GetJson = Callable[..., Any]


class OwnerLookup:
    """Owner reads through the upstream with a short, bounded, tenant-keyed cache of
    finds and misses alike."""

    def __init__(self, maxsize: int, ttl: float) -> None:
        self._cache: TTLCache[tuple[str, str], dict[str, Any]] | None = (
            TTLCache(maxsize=maxsize, ttl=ttl) if maxsize > 0 and ttl > 0 else None
        )

    async def fetch(
        self,
        get_json: GetJson,
        identity: Identity,
        target: RequestTarget,
        request_id: str = "",
        *,
        fresh: bool = False,
    ) -> dict[str, Any] | None:
        """The stored object (only as a mapping), or None when it does not exist (the
        caller decides as for an object nobody owns, so the two look alike); 503 if
        the upstream fails, so an owner decision is never made without the owner.
        `fresh` leaves the cache alone: the owner behind a write is always read anew
        (and what it finds, or not, is no hint to later reads either). What a read
        finds is cached, a miss as well: a repeated read of an object the caller does
        not own and of a missing one both come from the cache."""
        path = item_path(target)
        key = (identity.tenant, path)
        if self._cache is not None and not fresh:
            hit = self._cache.get(key)
            if hit is not None:
                return None if hit is _ABSENT else hit
        try:
            status, body = await get_json(path, identity, request_id=request_id)
        except StatusError as exc:
            raise StatusError(
                503, f"cannot check the owner of {target.resource} {target.name!r}: {exc.message}"
            ) from None
        if status == 404:
            if self._cache is not None and not fresh:
                self._cache[key] = _ABSENT
            return None
        if status != 200:
            raise StatusError(
                503,
                f"cannot check the owner of {target.resource} {target.name!r}: "
                f"the upstream answered {status}",
            )
        obj = body if isinstance(body, dict) else {}
        if self._cache is not None and not fresh:
            self._cache[key] = obj
        return obj

    def forget(self, identity: Identity, target: RequestTarget) -> None:
        if self._cache is not None:
            self._cache.pop((identity.tenant, item_path(target)), None)


# What kubectl's `get` asks for (DESIGN §10): a `meta.k8s.io` Table, `v1` or `v1beta1`.
TABLE_GROUP = "meta.k8s.io"
TABLE_VERSIONS = ("v1", "v1beta1")
INCLUDE_OBJECT = ("Metadata", "Object", "None")


def table_version(accept: str) -> str | None:
    """The Table apiVersion an `Accept` header asks for before plain JSON, or None.
    The reading of the reference store (backing_store/tables.py), kept in step with it
    by a contract test: the first JSON media range decides."""
    for media_range in accept.split(","):
        kind, *params = (part.strip() for part in media_range.split(";"))
        if kind.lower() not in ("application/json", "application/*", "*/*"):
            continue
        options = dict(p.split("=", 1) for p in params if "=" in p)
        wanted = options.get("as")
        if wanted is None:
            return None  # plain JSON comes first
        if (
            wanted == "Table"
            and options.get("g") == TABLE_GROUP
            and options.get("v") in TABLE_VERSIONS
        ):
            return f"{TABLE_GROUP}/{options['v']}"
    return None


@dataclass(frozen=True, slots=True)
class OwnerListFilter:
    """The owner filter of one list (DESIGN §5): which items and Table rows the caller
    may see, and what a kept row carries. Applied item by item as the answer streams
    (sidecar/services/listfilter.py).

    A list asked for as a Table (`table`, kubectl's `get`) is forwarded with
    `includeObject=Object`, so every row carries the object its owner is read from;
    a kept row then carries what the client asked for (`include`): the object, its
    `PartialObjectMetadata` (the Kubernetes default, `Metadata`) or nothing. A row
    whose object has no owner (e.g. an upstream that ignored `includeObject`) is
    dropped: never shown unfiltered."""

    tenant: str
    field: str
    table: str | None = None
    include: str = "Metadata"

    @property
    def upstream_query(self) -> list[tuple[str, str]]:
        """The parameters the list is forwarded with (replacing the client's own)."""
        query = [("owner", self.tenant)]
        if self.table is not None:
            query.append(("includeObject", "Object"))
        return query

    def item(self, obj: Any) -> Any | None:
        """A list item as the caller sees it, or None when the caller does not own it."""
        return obj if owner_value(obj, self.field) == self.tenant else None

    def row(self, row: Any) -> Any | None:
        """A Table row as the caller sees it, or None when the caller does not own its
        object."""
        if not isinstance(row, dict) or owner_value(row.get("object"), self.field) != self.tenant:
            return None
        if self.table is None or self.include == "Object":
            return row
        shown = {k: v for k, v in row.items() if k != "object"}
        if self.include == "Metadata":
            # As the Kubernetes API server does (handlers/response.go `asTable`): the
            # object's metadata, as a PartialObjectMetadata of the Table's group version.
            meta = row["object"].get("metadata")
            shown["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": self.table,
                "metadata": meta if isinstance(meta, dict) else {},
            }
        return shown


def list_filter(
    tenant: str, field: str, accept: str = "", include_object: str | None = None
) -> OwnerListFilter:
    """The owner filter for a list by a caller whose only grant is an owner rule.
    `accept`: the request's Accept header (a Table asked for?); `include_object`: its
    `includeObject` parameter, read as the store reads it (empty means Metadata), 400
    for any other value when a Table is asked for."""
    table = table_version(accept)
    include = include_object or "Metadata"
    if table is None:
        return OwnerListFilter(tenant, field)
    if include not in INCLUDE_OBJECT:
        raise StatusError(
            400,
            f"includeObject must be one of {', '.join(INCLUDE_OBJECT)}, not {include[:64]!r}",
        )
    return OwnerListFilter(tenant, field, table, include)


# How a write's body says what the stored object becomes: "" (a whole object), "merge"
# (RFC 7386) or "json" (RFC 6902), which the sidecar reads itself; "strategic" and
# "apply" (server-side apply), which only the upstream applies, so the owner rule is
# judged on the upstream's dry-run answer: `RESULT`, the object the write would make.
PatchKind = str
RESULT = "result"
APPLY = "apply"
UPSTREAM_APPLIES = frozenset({"strategic", APPLY})
# The Content-Types of the two patches the sidecar reads itself.
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def patch_kind(method: str, content_type: str) -> PatchKind:
    """How a write's body says what the stored object becomes."""
    if method.upper() != "PATCH":
        return ""
    if "strategic-merge-patch" in content_type:
        return "strategic"
    if "apply-patch" in content_type:
        return APPLY
    return "json" if "json-patch" in content_type else "merge"


def enforce_owner(
    doc: Any,
    tenant: str,
    fields: Sequence[str],
    verb: str,
    kind: PatchKind,
    before: Any = None,
) -> Any:
    """The owner rule for a write under a grant that is not cluster-wide (DESIGN §5):
    every owner field ends up the caller's tenant. A create or update with no owner
    (missing, null, "") gets `tenant`; a patch may leave the owner alone or set it to
    `tenant`; any other owner, or a shape that hides it, is 403. Returns a checked copy
    of `doc` (the bytes to forward); 400 for a body of the wrong JSON type.

    `kind` RESULT: `doc` is the object the write would make (the upstream's dry run)
    and `before` the stored one (None: the write creates it); each owner field must be
    the caller's tenant or what it was, and on a create the caller's tenant: the
    sidecar cannot fill in a body it does not read. Returns None: the request's own
    body is what goes upstream."""
    if kind == RESULT:
        if not isinstance(doc, dict):
            raise StatusError(502, "the upstream's dry run did not answer with an object")
        for field in fields:
            _check_result(doc, before if isinstance(before, dict) else None, tenant, field)
        return None
    if kind in UPSTREAM_APPLIES:
        raise AssertionError("a patch only the upstream applies is judged on its dry run")
    if kind == "json":
        if not isinstance(doc, list):
            raise StatusError(400, "a JSON patch must be a list of operations")
        for field in fields:
            _check_json_patch(doc, tenant, field)
        return doc
    if not isinstance(doc, dict):
        raise StatusError(400, "the request body must be a JSON object")
    out = copy.deepcopy(doc)
    for field in fields:
        _check_object(out, tenant, field, patch=kind == "merge", verb=verb)
    return out


def _foreign(field: str, tenant: str, value: Any) -> StatusError:
    return forbidden(
        f"{field} must be your tenant {tenant!r} or empty, not "
        f"{json.dumps(value)}: only a cluster-wide grant (ClusterRoleBinding) "
        "may set another owner"
    )


def _cleared(field: str) -> StatusError:
    return forbidden(f"{field} cannot be cleared by a patch: owners cannot give objects away")


def _check_object(body: dict[str, Any], tenant: str, field: str, *, patch: bool, verb: str) -> None:
    parts = field.split(".")
    try:
        value = _raw_at(body, parts)
    except ValueError:
        raise forbidden(
            f"{field} has the wrong shape: {'.'.join(parts[:-1])} must be an object"
        ) from None
    if value == tenant or (patch and value is _MISSING):
        return
    if value is _MISSING or value is None or value == "":
        if patch:
            raise _cleared(field)
        node = body
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
                node[part] = nxt
            node = nxt
        node[parts[-1]] = tenant
        return
    raise _foreign(field, tenant, value)


def _check_result(
    after: dict[str, Any], before: dict[str, Any] | None, tenant: str, field: str
) -> None:
    parts = field.split(".")
    try:
        value = _raw_at(after, parts)
    except ValueError:
        raise forbidden(
            f"{field} would have the wrong shape: {'.'.join(parts[:-1])} must be an object"
        ) from None
    if value == tenant:
        return
    empty = (_MISSING, None, "")
    if before is None:
        if value in empty:
            raise forbidden(
                f"{field} must be set to your tenant {tenant!r} on an apply that creates "
                "the object (the sidecar does not fill in a body it does not read)"
            )
        raise _foreign(field, tenant, value)
    try:
        old = _raw_at(before, parts)
    except ValueError:
        old = _MISSING
    if value == old or (value in empty and old in empty):
        return
    if value in empty:
        raise _cleared(field)
    raise _foreign(field, tenant, value)


def _check_json_patch(ops: list[Any], tenant: str, field: str) -> None:
    owner = JsonPointer.from_parts(field.split("."))
    pointer = owner.path
    for op in ops:
        if not isinstance(op, dict):
            raise StatusError(400, "a JSON patch operation must be an object")
        for key in ("path", "from"):
            p = op.get(key)
            if not isinstance(p, str):
                continue
            try:
                at = JsonPointer(p)
            except JsonPointerException as exc:
                raise StatusError(400, f"invalid JSON patch: {exc}") from None
            # The operation reaches the owner when it is at the owner or above it.
            touches = owner.parts[: len(at.parts)] == at.parts
            if not touches or (key == "path" and op.get("op") == "test"):
                continue
            if key == "path" and op.get("op") in ("add", "replace") and at == owner:
                value = op.get("value")
                if value == tenant:
                    continue
                if value is None or value == "":
                    raise _cleared(field)
                raise _foreign(field, tenant, value)
            raise forbidden(
                f"this JSON patch operation on {op.get(key)!r} would change "
                f"{field}: set it to your tenant {tenant!r} at {pointer} or "
                "leave it alone"
            )

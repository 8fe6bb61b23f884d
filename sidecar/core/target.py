"""Request-target parsing: an HTTP method, raw path and query become a `RequestTarget`.

Owns the URL grammar of DESIGN §3 and nothing else: no identity, no policy. A short
path (`/api/v1/namespaces/dev/pods`) parses with `tenant=None, short_path=True`;
`RequestTarget.resolve_tenant` fills the tenant once the caller is known. The access
and identity reviews at their standard Kubernetes paths
(`/apis/authorization.k8s.io/v1/selfsubjectaccessreviews`, …) are short paths too:
tenant-scoped resources of the caller's tenant (DESIGN §5).

A list or watch whose `fieldSelector` requires `metadata.name=X` (`=` or `==`, alone or
ANDed with other terms) has the name X, as in Kubernetes, so a `resourceNames` rule can
allow watching one object. The selector is read with the grammar the backing store
uses (`\\,` `\\=` `\\\\` escapes); a malformed selector, one given twice, or a name
that is not a valid path segment leaves the name empty (the request then needs a
grant on the whole collection).

One reading (DESIGN §1, §3, §8): the path and the query are parsed once, here, and
the target forwarded upstream is rebuilt from that parse (`RequestTarget.upstream_target`):
each path segment percent-encoded canonically (`%2F` inside a segment stays encoded),
a short path with the caller's tenant filled in, the query re-encoded from the decoded
parameters. So the upstream cannot read a parameter the decision did not. A `#` anywhere
in the target, a parameter the decision reads (`DECISION_PARAMS`) given twice, an empty
parameter name, a control character, an invalid percent-encoding or non-UTF-8 in the
query: 400. `watch` takes Go's boolean spellings (as the Kubernetes API server reads
it) and is forwarded as `true` or `false`; anything else is a 400.

Every malformed target raises `TargetError` (a 400, or 405 for an unknown method);
the parser never raises anything else.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote, unquote

__all__ = [
    "DECISION_PARAMS",
    "DEFAULT_TENANT",
    "RESERVED_TENANTS",
    "SYSTEM_TENANT",
    "RequestTarget",
    "Scope",
    "SelectorError",
    "TargetError",
    "decode_segment",
    "field_terms",
    "is_dns1123_label",
    "parse_target",
]

SYSTEM_TENANT = "system"
DEFAULT_TENANT = "default"
# The tenants that always exist: no Tenant object is needed (nor may be deleted).
RESERVED_TENANTS = (SYSTEM_TENANT, DEFAULT_TENANT)

MAX_LABEL = 63
MAX_NAME = 253

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HEX = frozenset("0123456789abcdefABCDEF")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SEPARATORS = re.compile(r"[/\\]")
_DOTS = frozenset({".", ".."})
# Subresources that belong to the Tenant / Namespace object itself, not resource names.
_OBJECT_SUBRESOURCES = frozenset({"status", "finalize"})
_RESOURCE_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
_NON_RESOURCE_METHODS = _RESOURCE_METHODS | {"OPTIONS"}
# Query parameters a decision (or a stage that charges or filters) reads: each may be
# given at most once, so no upstream can pick another occurrence than the one decided.
DECISION_PARAMS = frozenset(
    {
        "watch",
        "fieldSelector",
        "labelSelector",
        "dryRun",
        "resourceVersion",
        "timeoutSeconds",
        "owner",
    }
)
# Go's strconv.ParseBool, which the Kubernetes API server reads `watch` with.
_BOOLS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Characters kept as they are in a forwarded path segment / query part; everything else
# is percent-encoded (UTF-8). `;` is encoded: some servers read it as a parameter.
_PATH_SAFE = ":@"
_PLAIN_SEGMENT = re.compile(r"^[A-Za-z0-9._~:@-]+$")
# (group, resource) served at `/apis/{group}/{v}/{resource}` as a tenant-scoped
# resource of the caller's tenant (the same under `tenants/{t}/`).
_SHORT_PATH_RESOURCES = frozenset(
    {
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectrulesreviews"),
        ("authentication.k8s.io", "selfsubjectreviews"),
    }
)


class TargetError(ValueError):
    """The request target cannot be parsed; `code` is the HTTP status to answer."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Scope(StrEnum):
    CLUSTER = "cluster"
    TENANT = "tenant"
    NAMESPACE = "namespace"


@dataclass(frozen=True, slots=True)
class RequestTarget:
    """What a request addresses. Field names follow Kubernetes' RequestInfo."""

    path: str
    verb: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    scope: Scope | None = None
    tenant: str | None = None
    namespace: str | None = None
    resource: str = ""
    subresource: str = ""
    name: str = ""
    # Segments after the subresource, e.g. ("red",) for servers/web1/tags/red.
    extra: tuple[str, ...] = ()
    # True when the URL named no tenant and the caller's tenant applies.
    short_path: bool = False
    # True when `name` is a list's `fieldSelector` name, not a path segment.
    name_from_selector: bool = False
    # The decoded query parameters in order, as the decision read them (`watch`
    # normalised to true/false) and as the upstream receives them.
    query: tuple[tuple[str, str], ...] = ()
    # The forwarded target (path and query, canonically encoded). For a short path
    # before its tenant is known: `encoded` is the part before where `tenants/{t}` goes
    # and `encoded_tail` the rest.
    encoded: str = ""
    encoded_tail: str = ""

    @property
    def is_collection(self) -> bool:
        return self.resource_request and not self.name

    @property
    def full_resource(self) -> str:
        """`resource/subresource` as RBAC rules name it (`servers/tags`)."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def resolve_tenant(self, caller_tenant: str) -> RequestTarget:
        """Fill the tenant of a short path: the caller's, `default` for a system caller.
        The forwarded target then names that tenant (`tenants/{t}/…`)."""
        if not self.short_path or self.tenant is not None:
            return self
        tenant = DEFAULT_TENANT if caller_tenant == SYSTEM_TENANT else caller_tenant
        encoded = self.encoded
        if encoded or self.encoded_tail:
            encoded = f"{encoded}/tenants/{_segment(tenant)}{self.encoded_tail}"
        return dataclasses.replace(self, tenant=tenant, encoded=encoded, encoded_tail="")

    def tenant_for(self, caller_tenant: str) -> str:
        """The tenant the request is in: the one it names, else (a short path) the
        caller's (`default` for a system caller, as `resolve_tenant` fills it)."""
        return self.resolve_tenant(caller_tenant).tenant or caller_tenant

    def within_tenant(self, tenant: str) -> RequestTarget:
        """A cluster-level list or watch (`/api/v1/configmaps`) as the same request in
        one tenant (`/api/v1/tenants/{tenant}/configmaps`): what a tenant user's
        `kubectl get -A` means (DESIGN §3). Only for collections at the cluster level."""
        assert self.scope == Scope.CLUSTER and self.resource_request and not self.subresource
        encoded = ""
        if self.encoded:  # a parsed target (a review's is never forwarded)
            path, sep, query = self.encoded.partition("?")
            head, _, last = path.rpartition("/")
            encoded = f"{head}/tenants/{_segment(tenant)}/{last}{sep}{query}"
        return dataclasses.replace(self, scope=Scope.TENANT, tenant=tenant, encoded=encoded)

    def param(self, key: str) -> str | None:
        """The value of a query parameter (the first; decision parameters occur once)."""
        for k, v in self.query:
            if k == key:
                return v
        return None

    @property
    def upstream_path(self) -> str:
        """The forwarded path alone (canonically encoded), without the query."""
        return self.encoded.partition("?")[0]

    def upstream_target(self, overrides: Sequence[tuple[str, str]] = ()) -> str:
        """The request target to forward: this parse, canonically encoded. `overrides`
        (the sidecar's own parameters, e.g. the owner filter) replace every parameter
        of the same name."""
        if not overrides:
            return self.encoded
        path = self.encoded.partition("?")[0]
        names = {k for k, _ in overrides}
        query = [(k, v) for k, v in self.query if k not in names] + list(overrides)
        return path + _encode_query(query)

    def as_dict(self) -> dict[str, object]:
        """The `target` object of `policy explain --json` (DESIGN §5)."""
        return {
            "verb": self.verb,
            "apiGroup": self.api_group,
            "apiVersion": self.api_version,
            "scope": self.scope.value if self.scope else None,
            "tenant": self.tenant,
            "namespace": self.namespace,
            "resource": self.resource,
            "subresource": self.subresource,
            "name": self.name,
            "resourceRequest": self.resource_request,
            "path": self.path,
        }


def is_dns1123_label(value: str) -> bool:
    return len(value) <= MAX_LABEL and _DNS1123_LABEL.match(value) is not None


def parse_target(
    method: str,
    raw_path: str,
    query_string: str = "",
    *,
    query_pairs: Sequence[tuple[str, str]] | None = None,
) -> RequestTarget:
    """Parse one request. `raw_path` is the request target as sent (still
    percent-encoded), with its query or with the query given as `query_string`.
    `query_pairs`: the query already decoded by a server framework (the backing store
    reads it with aiohttp); the query part of `raw_path` is then not read."""
    method = method.upper()
    if "#" in raw_path or "#" in query_string:
        raise TargetError("the request target contains '#' (a fragment has no place in a request)")
    path, has_query, inline_query = raw_path.partition("?")
    if has_query:
        query_string = inline_query
    if query_pairs is None:
        query = _parse_query(query_string) if query_string else ()
    else:
        query = tuple(query_pairs)
    query = _checked_query(query)
    segments = _split_path(path)
    if not segments or segments[0] not in ("api", "apis"):
        return _non_resource(method, path, segments, query)

    # /api/{version}/... or /apis/{group}/{version}/...; shorter is discovery.
    if segments[0] == "api":
        if len(segments) < 3:
            return _non_resource(method, path, segments, query)
        group, version, rest, head = "", segments[1], segments[2:], 2
    else:
        if len(segments) < 4:
            return _non_resource(method, path, segments, query)
        group, version, rest, head = segments[1], segments[2], segments[3:], 3
    _no_separator(group, "API group")
    _no_separator(version, "API version")

    if method not in _RESOURCE_METHODS:
        raise TargetError(f"method {method} is not allowed on {path}", code=405)

    watch = False
    if rest[0] == "watch":
        watch = True
        rest = rest[1:]
        head += 1
        if not rest:
            raise TargetError("watch/ must be followed by a resource")
    if _watch_param(query):
        watch = True

    fields = _scope_fields(rest)
    if len(rest) == 1 and (group, rest[0]) in _SHORT_PATH_RESOURCES:
        fields.update(scope=Scope.TENANT, short_path=True)
    name = fields["name"]
    assert isinstance(name, str)
    verb = _verb(method, bool(name), watch)
    if watch and method != "GET":
        # Not HEAD either: a HEAD answer ends at its headers while the upstream may go
        # on watching on that connection.
        raise TargetError("watch is only valid with GET", code=405)
    if verb in ("list", "watch") and not name:
        selected = selected_name(query)
        if selected:
            fields.update(name=selected, name_from_selector=True)
    encoded_path = [_segment(seg) for seg in segments]
    encoded_query = _encode_query(query)
    if fields.get("short_path"):
        encoded = "/" + "/".join(encoded_path[:head])
        tail = "/" + "/".join(encoded_path[head:]) + encoded_query
    else:
        encoded, tail = "/" + "/".join(encoded_path) + encoded_query, ""
    return RequestTarget(
        path=path,
        verb=verb,
        resource_request=True,
        api_group=group,
        api_version=version,
        query=query,
        encoded=encoded,
        encoded_tail=tail,
        **fields,  # type: ignore[arg-type]
    )


def _scope_fields(rest: list[str]) -> dict[str, object]:
    """Map the segments after the API prefix to scope/tenant/namespace/resource/name."""
    if rest[0] == "tenants":
        if len(rest) == 1:
            return _item(Scope.CLUSTER, None, None, rest)
        tenant = _label(rest[1], "tenant")
        tail = rest[2:]
        if not tail or tail[0] in _OBJECT_SUBRESOURCES:
            # The Tenant object itself: /tenants/{t}[/status|/finalize]
            fields = _item(Scope.CLUSTER, None, None, rest)
            fields["tenant"] = tenant
            return fields
        return _tenant_tail(tenant, tail, short=False)
    if rest[0] == "namespaces":
        # A short path: namespace objects and namespaced resources of the caller's tenant.
        return _tenant_tail(None, rest, short=True)
    return _item(Scope.CLUSTER, None, None, rest)


def _tenant_tail(tenant: str | None, tail: list[str], *, short: bool) -> dict[str, object]:
    if tail[0] == "namespaces" and len(tail) >= 3 and tail[2] not in _OBJECT_SUBRESOURCES:
        namespace = _label(tail[1], "namespace")
        fields = _item(Scope.NAMESPACE, tenant, namespace, tail[2:])
    else:
        if tail[0] == "namespaces" and len(tail) >= 2:
            _label(tail[1], "namespace")
        fields = _item(Scope.TENANT, tenant, None, tail)
    fields["short_path"] = short
    return fields


def _item(
    scope: Scope, tenant: str | None, namespace: str | None, segs: list[str]
) -> dict[str, object]:
    """`{resource}[/{name}[/{subresource}[/...]]]` at the given scope."""
    resource = segs[0]
    _no_separator(resource, "resource")
    if len(segs) > 2:
        _no_separator(segs[2], "subresource")
    if len(resource) > MAX_NAME:
        raise TargetError(f"resource {resource[:40]}... is longer than {MAX_NAME} characters")
    name = segs[1] if len(segs) > 1 else ""
    if len(name) > MAX_NAME:
        raise TargetError(f"name {name[:40]}... is longer than {MAX_NAME} characters")
    return {
        "scope": scope,
        "tenant": tenant,
        "namespace": namespace,
        "resource": resource,
        "name": name,
        "subresource": segs[2] if len(segs) > 2 else "",
        "extra": tuple(segs[3:]),
    }


def _verb(method: str, has_name: bool, watch: bool) -> str:
    if watch:
        return "watch"
    if method in ("GET", "HEAD"):
        return "get" if has_name else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    return "delete" if has_name else "deletecollection"


def _label(value: str, what: str) -> str:
    if not is_dns1123_label(value):
        if len(value) > MAX_LABEL:
            raise TargetError(f"{what} name is longer than {MAX_LABEL} characters")
        raise TargetError(
            f"{what} name {value!r} is not a DNS-1123 label "
            "(lower-case letters, digits and '-', starting and ending with a letter or digit)"
        )
    return value


def _no_separator(segment: str, what: str) -> None:
    """DESIGN §3: a segment that an upstream decoding the path would split (an encoded
    `/`, or a `\\` some servers treat as one) must not be where it could change what
    the path addresses."""
    if "/" in segment or "\\" in segment:
        raise TargetError(
            f"the {what} segment contains an encoded '/' or a '\\' (%2F, %5C): not allowed there"
        )


def _non_resource(
    method: str, raw_path: str, segments: list[str], query: tuple[tuple[str, str], ...]
) -> RequestTarget:
    for seg in segments:
        _no_separator(seg, "non-resource URL")
    if method not in _NON_RESOURCE_METHODS:
        raise TargetError(f"method {method} is not allowed", code=405)
    encoded = "/" + "/".join(_segment(seg) for seg in segments) + _encode_query(query)
    return RequestTarget(
        path=raw_path, verb=method.lower(), resource_request=False, query=query, encoded=encoded
    )


def _split_path(raw_path: str) -> list[str]:
    """Split on literal '/', then decode each segment: `%2F` stays inside its segment."""
    if not raw_path.startswith("/"):
        raise TargetError("the path must start with '/'")
    if raw_path == "/":
        return []
    parts = raw_path[1:].split("/")
    out = []
    for raw in parts:
        if raw == "":
            raise TargetError("the path has an empty segment ('//' or a trailing '/')")
        seg = _decode(raw)
        # Also a dot-segment behind an encoded separator (`x%2F..`): an upstream that
        # decodes before routing would climb out of the addressed object.
        if seg in (".", "..") or not _DOTS.isdisjoint(_SEPARATORS.split(seg)):
            raise TargetError("the path has a '.' or '..' segment")
        out.append(seg)
    return out


def decode_segment(raw: str) -> str:
    """One raw path segment decoded as every path is (`TargetError` when malformed)."""
    return _decode(raw)


def _decode(raw: str) -> str:
    if "%" not in raw:
        if not raw.isascii():
            # aiohttp hands us raw bytes decoded as UTF-8 with surrogate escapes.
            try:
                raw.encode("utf-8")
            except UnicodeEncodeError:
                raise TargetError("the path is not valid UTF-8") from None
        if _CONTROL.search(raw):
            raise TargetError("the path contains control characters")
        return raw
    buf = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "%":
            if i + 2 >= n:
                raise TargetError("invalid percent-encoding in the path")
            hi, lo = raw[i + 1], raw[i + 2]
            if hi not in _HEX or lo not in _HEX:
                raise TargetError("invalid percent-encoding in the path")
            buf.append(int(hi + lo, 16))
            i += 3
        else:
            try:
                buf += c.encode("utf-8")
            except UnicodeEncodeError:
                raise TargetError("the path is not valid UTF-8") from None
            i += 1
    try:
        text = buf.decode("utf-8")
    except UnicodeDecodeError:
        raise TargetError("the path is not valid UTF-8") from None
    if _CONTROL.search(text):
        raise TargetError("the path contains control characters")
    return text


def selected_name(query: Sequence[tuple[str, str]]) -> str:
    """The name a list's `fieldSelector` requires (`metadata.name=X`), or ""."""
    selectors = [v for k, v in query if k == "fieldSelector"]
    if len(selectors) != 1:
        return ""
    try:
        for field, op, value in field_terms(selectors[0]):
            if field != "metadata.name" or op == "!=":
                continue
            return value if _path_segment_name(value) else ""
    except SelectorError:
        return ""
    return ""


class SelectorError(ValueError):
    """A malformed `fieldSelector`; the message says what is wrong (the store's 400)."""


def field_terms(text: str) -> Iterator[tuple[str, str, str]]:
    """A `fieldSelector`'s terms as (field, operator, value), in order, as the Kubernetes
    API server reads them (and the backing store, which shares this reading): split at
    each unescaped `,` (empty terms skipped), each term at its first unescaped `!=`,
    `==` or `=`, the value's `\\,` `\\=` `\\\\` escapes undone. Raises `SelectorError`
    when it reaches a malformed term."""
    for raw in _split_unescaped(text, ","):
        if not raw:
            continue
        for op in ("!=", "==", "="):
            at = _find_unescaped(raw, op)
            if at >= 0:
                break
        else:
            raise SelectorError(f"can't understand {raw!r}")
        yield raw[:at], op, _unescape(raw[at + len(op) :])


def _path_segment_name(value: str) -> bool:
    return (
        0 < len(value) <= MAX_NAME
        and value not in _DOTS
        and "%" not in value
        and not _SEPARATORS.search(value)
    )


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if c == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    return parts


def _find_unescaped(term: str, op: str) -> int:
    i = 0
    while i < len(term):
        if term[i] == "\\":
            i += 2
            continue
        if term.startswith(op, i):
            return i
        i += 1
    return -1


def _unescape(value: str) -> str:
    """The value with its escapes undone; `SelectorError` when malformed."""
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\":
            nxt = value[i + 1 : i + 2]
            if nxt not in ("\\", ",", "="):
                raise SelectorError(f"bad escape in {value!r}")
            out.append(nxt)
            i += 2
            continue
        if c in ",=":
            raise SelectorError(f"unescaped {c!r} in {value!r}")
        out.append(c)
        i += 1
    return "".join(out)


def _parse_query(query_string: str) -> tuple[tuple[str, str], ...]:
    """`k=v&…` decoded once (`+` is a space), as `application/x-www-form-urlencoded`
    and aiohttp read it; empty parts (`&&`) are skipped, `k` alone is `k=`."""
    if _BAD_ESCAPE.search(query_string):
        raise TargetError("invalid percent-encoding in the query")
    pairs = []
    for part in query_string.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            pairs.append((_unquote_plus(key), _unquote_plus(value)))
        except UnicodeDecodeError:
            raise TargetError("the query is not valid UTF-8") from None
    return tuple(pairs)


def _unquote_plus(text: str) -> str:
    return unquote(text.replace("+", " "), errors="strict") if "%" in text or "+" in text else text


def _checked_query(query: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """400 for what two readers could read differently; `watch` normalised."""
    seen: set[str] = set()
    normal = False
    for key, value in query:
        if not key:
            raise TargetError("the query has a parameter without a name")
        for text in (key, value):
            if _CONTROL.search(text):
                raise TargetError("the query contains control characters")
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise TargetError("the query is not valid UTF-8") from None
        if key in DECISION_PARAMS:
            if key in seen:
                raise TargetError(f"the query parameter {key!r} is given more than once")
            seen.add(key)
            if key == "watch":
                if value not in _BOOLS:
                    raise TargetError(f"watch must be true or false, not {value[:40]!r}")
                normal = value not in ("true", "false")
    if normal:
        query = tuple(
            (k, ("true" if _BOOLS[v] else "false") if k == "watch" else v) for k, v in query
        )
    return query


def _watch_param(query: tuple[tuple[str, str], ...]) -> bool:
    for key, value in query:
        if key == "watch":
            return value == "true"
    return False


def _segment(text: str) -> str:
    return text if _PLAIN_SEGMENT.match(text) else quote(text, safe=_PATH_SAFE)


def _encode_query(query: Sequence[tuple[str, str]]) -> str:
    if not query:
        return ""
    return "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)

"""`fieldSelector` and `labelSelector` on lists, watches and deletecollection (DESIGN §10).

The grammars are Kubernetes' own (k8s.io/apimachinery `fields` and `labels`):
- fieldSelector: comma-ANDed `field=value`, `field==value`, `field!=value`; `\\,`, `\\=`
  and `\\\\` escape inside values. The selectable fields are Kubernetes' own, per
  resource (`SELECTABLE` below, from each kind's field-label conversion function):
  `metadata.name` and `metadata.namespace` (the empty string for objects that are not
  namespace-scoped) everywhere, plus e.g. `involvedObject.*`, `reason`, `type` on events
  and `spec.nodeName`, `status.phase` on pods, which `kubectl describe` sends. Any other
  field → 400 worded as Kubernetes words it for that kind.
- labelSelector: comma-ANDed `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`
  (has the label), `!k` (has not). `k!=v` and `k notin (…)` also match objects without
  the label, as in Kubernetes. Keys and values follow the label syntax rules (a value
  may be empty). `<` and `>` are not supported (400).

One parsed `Selector` answers both as SQL (lists: the filter runs in the key-range
scan, so paging counts only matching objects) and in Python (watch events); the two
are kept the same by the tests, which run every case through both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.core.target import SelectorError, field_terms

from .errors import bad_request
from .storage import Clause

MAX_LABEL_VALUE = 63
_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_OPERATORS = frozenset({"!=", "==", "=", "!", ",", "(", ")", "<", ">"})
_TOKEN = re.compile(r"\s*(?:(!=|==|=|!|,|\(|\)|<|>)|([^\s!=,()<>]+))")


def label_key_error(key: str) -> str | None:
    """Why `key` is not a valid label key (`[prefix/]name`), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"label key {key!r}: the prefix must be a DNS-1123 subdomain"
    if not name or len(name) > MAX_LABEL_VALUE or not _NAME.match(name):
        return (
            f"label key {key!r}: the name must be 1-63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    return None


def label_value_error(value: str) -> str | None:
    if len(value) > MAX_LABEL_VALUE or not _NAME.match(value):
        return (
            f"label value {value!r} must be at most 63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit (or empty)"
        )
    return None


def validate_labels(labels: object) -> None:
    """`metadata.labels` of an object being written: a map of valid keys to values."""
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise bad_request("metadata.labels must be a map of strings")
    for key, value in labels.items():
        if not isinstance(value, str):
            raise bad_request(f"metadata.labels[{key!r}] must be a string")
        error = label_key_error(key) or label_value_error(value)
        if error:
            raise bad_request(f"metadata.labels: {error}")


# -- selectable fields ------------------------------------------------------------------

FieldKind = Literal["text", "bool", "int"]
_INT64 = 2**63


@dataclass(frozen=True, slots=True)
class Field:
    """How a selectable field reads an object, as Kubernetes renders it for matching:
    the first non-empty string at `paths` (or ""); a bool as "true"/"false"; an int as
    its decimal digits ("0" when absent). SQL (`sql`) and Python (`value`) agree."""

    paths: tuple[str, ...]
    kind: FieldKind = "text"

    def sql(self) -> Clause:
        params: list[object] = []
        if self.kind == "bool":
            params.append(_json_path(self.paths[0]))
            return ("(CASE json_type(o.data, ?) WHEN 'true' THEN 'true' ELSE 'false' END)", params)
        if self.kind == "int":
            params += [_json_path(self.paths[0])] * 2
            expr = (
                "(CASE json_type(o.data, ?) WHEN 'integer' "
                "THEN CAST(json_extract(o.data, ?) AS TEXT) ELSE '0' END)"
            )
            return (expr, params)
        parts = []
        for path in self.paths:
            parts.append(
                "nullif(CASE json_type(o.data, ?) WHEN 'text' THEN json_extract(o.data, ?) END, '')"
            )
            params += [_json_path(path)] * 2
        return (f"coalesce({', '.join(parts)}, '')", params)

    def value(self, obj: Mapping[str, Any]) -> str:
        if self.kind == "bool":
            return "true" if _at(obj, self.paths[0]) is True else "false"
        if self.kind == "int":
            got = _at(obj, self.paths[0])
            in_range = type(got) is int and -_INT64 <= got < _INT64
            return str(got) if in_range else "0"
        for path in self.paths:
            got = _at(obj, path)
            if isinstance(got, str) and got:
                return got
        return ""


def _json_path(dotted: str) -> str:
    return "$." + dotted


def _at(obj: Mapping[str, Any], dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


@dataclass(frozen=True, slots=True)
class Selectable:
    """The fields one resource can be selected by, and how Kubernetes words a refusal."""

    fields: Mapping[str, Field]
    refusal: str  # str.format with `label`


_TEXT = Field  # a plain string field at one path: `_TEXT(("spec.nodeName",))`
_META = {
    "metadata.name": _TEXT(("metadata.name",)),
    "metadata.namespace": _TEXT(("metadata.namespace",)),
}
# Core kinds with a conversion function of their own (k8s.io/kubernetes
# pkg/apis/core/v1/conversion.go) word it so; every other kind gets the fallback of
# k8s.io/apimachinery runtime.DefaultMetaV1FieldSelectorConversion.
_CORE = "field label not supported: {label}"
_DEFAULT = '"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'


def _core(**fields: Field) -> Selectable:
    return Selectable({**_META, **{k.replace("__", "."): v for k, v in fields.items()}}, _CORE)


# The one table of selectable fields, by resource plural (kubectl's `describe` sends the
# event and pod ones). `metadata.namespace` is kept on every resource, cluster-scoped
# ones included, where Kubernetes' nodes and namespaces would refuse it.
SELECTABLE: dict[str, Selectable] = {
    "events": Selectable(
        {
            **_META,
            **{
                f"involvedObject.{f}": _TEXT((f"involvedObject.{f}",))
                for f in (
                    "kind",
                    "namespace",
                    "name",
                    "uid",
                    "apiVersion",
                    "resourceVersion",
                    "fieldPath",
                )
            },
            "reason": _TEXT(("reason",)),
            "reportingComponent": _TEXT(("reportingComponent",)),
            # the event's source component, else the reporting controller
            "source": _TEXT(("source.component", "reportingComponent")),
            "type": _TEXT(("type",)),
        },
        _CORE,
    ),
    "pods": _core(
        spec__nodeName=_TEXT(("spec.nodeName",)),
        spec__host=_TEXT(("spec.nodeName",)),  # the old v1 name of spec.nodeName
        spec__restartPolicy=_TEXT(("spec.restartPolicy",)),
        spec__schedulerName=_TEXT(("spec.schedulerName",)),
        spec__serviceAccountName=_TEXT(("spec.serviceAccountName",)),
        spec__hostNetwork=Field(("spec.hostNetwork",), "bool"),
        status__phase=_TEXT(("status.phase",)),
        status__podIP=_TEXT(("status.podIP",)),
        status__nominatedNodeName=_TEXT(("status.nominatedNodeName",)),
    ),
    "nodes": _core(spec__unschedulable=Field(("spec.unschedulable",), "bool")),
    "namespaces": _core(status__phase=_TEXT(("status.phase",))),
    "secrets": _core(type=_TEXT(("type",))),
    "services": _core(spec__clusterIP=_TEXT(("spec.clusterIP",)), spec__type=_TEXT(("spec.type",))),
    "replicationcontrollers": _core(status__replicas=Field(("status.replicas",), "int")),
    "replicasets": _core(status__replicas=Field(("status.replicas",), "int")),
    "jobs": Selectable(
        {**_META, "status.successful": Field(("status.successful",), "int")},
        'field label "{label}" not supported for batchv1.Job',
    ),
}
_FALLBACK = Selectable(_META, _DEFAULT)


def selectable(plural: str) -> Selectable:
    return SELECTABLE.get(plural, _FALLBACK)


@dataclass(frozen=True, slots=True)
class FieldTerm:
    field: str
    equal: bool
    value: str
    reader: Field

    def clause(self) -> Clause:
        expr, params = self.reader.sql()
        return (f"{expr} {'=' if self.equal else '!='} ?", [*params, self.value])

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (self.reader.value(obj) == self.value) == self.equal


@dataclass(frozen=True, slots=True)
class LabelTerm:
    key: str
    op: str  # "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def clause(self) -> Clause:
        path = f'$.metadata.labels."{self.key}"'
        marks = ",".join("?" * len(self.values))
        if self.op == "in":
            return (f"json_extract(o.data, ?) IN ({marks})", [path, *self.values])
        if self.op == "notin":
            cond = f"(json_extract(o.data, ?) IS NULL OR json_extract(o.data, ?) NOT IN ({marks}))"
            return (cond, [path, path, *self.values])
        if self.op == "exists":
            return ("json_extract(o.data, ?) IS NOT NULL", [path])
        return ("json_extract(o.data, ?) IS NULL", [path])

    def matches(self, labels: Mapping[str, Any]) -> bool:
        value = labels.get(self.key)
        if self.op == "in":
            return value in self.values
        if self.op == "notin":
            return value not in self.values
        return (value is not None) == (self.op == "exists")


@dataclass(frozen=True, slots=True)
class Selector:
    fields: tuple[FieldTerm, ...] = ()
    labels: tuple[LabelTerm, ...] = ()
    # The name a `metadata.name=X` term pins the request to (DESIGN §3), if any.
    name: str | None = field(default=None)

    def __bool__(self) -> bool:
        return bool(self.fields or self.labels)

    def clauses(self) -> list[Clause]:
        return [t.clause() for t in self.fields] + [t.clause() for t in self.labels]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        labels = meta.get("labels")
        labels = labels if isinstance(labels, dict) else {}
        return all(t.matches(obj) for t in self.fields) and all(
            t.matches(labels) for t in self.labels
        )


def from_query(query: Mapping[str, str], plural: str) -> Selector:
    """The selectors of a list/watch query on `plural`; 400 for a malformed one or a
    field that resource cannot be selected by."""
    fields = parse_field_selector(query.get("fieldSelector", ""), plural)
    labels = parse_label_selector(query.get("labelSelector", ""))
    name = next((t.value for t in fields if t.field == "metadata.name" and t.equal), None)
    return Selector(fields, labels, name)


# -- fieldSelector ---------------------------------------------------------------------


def parse_field_selector(text: str, plural: str) -> tuple[FieldTerm, ...]:
    table = selectable(plural)
    terms: list[FieldTerm] = []
    try:
        for name, op, value in field_terms(text):
            reader = table.fields.get(name)
            if reader is None:
                raise bad_request(table.refusal.format(label=name))
            terms.append(FieldTerm(name, op != "!=", value, reader))
    except SelectorError as exc:
        raise bad_request(f"invalid field selector {text!r}: {exc}") from None
    return tuple(terms)


# -- labelSelector ---------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise bad_request(f"invalid label selector {text!r}")
        out.append(m.group(1) or m.group(2))
        pos = m.end()
    return out


def parse_label_selector(text: str) -> tuple[LabelTerm, ...]:
    tokens = _tokens(text)
    terms: list[LabelTerm] = []
    i = 0

    def fail(why: str) -> Exception:
        return bad_request(f"invalid label selector {text!r}: {why}")

    def word(at: int) -> str | None:
        tok = tokens[at] if at < len(tokens) else None
        return None if tok is None or tok in _OPERATORS else tok

    while i < len(tokens):
        if tokens[i] == "!":
            key = word(i + 1)
            if key is None:
                raise fail("'!' must be followed by a label key")
            terms.append(LabelTerm(_key(key, fail), "!"))
            i += 2
        else:
            key = word(i)
            if key is None:
                raise fail(f"expected a label key, found {tokens[i]!r}")
            key = _key(key, fail)
            op = tokens[i + 1] if i + 1 < len(tokens) else ","
            if op == ",":
                terms.append(LabelTerm(key, "exists"))
                i += 1
            elif op in ("=", "==", "!="):
                value = word(i + 2)
                terms.append(
                    LabelTerm(key, "notin" if op == "!=" else "in", (_value(value or "", fail),))
                )
                i += 3 if value is not None else 2
            elif op in ("in", "notin"):
                values, i = _set_values(tokens, i + 2, word, fail)
                terms.append(LabelTerm(key, op, values))
            elif op in ("<", ">"):
                raise fail("the '<' and '>' operators are not supported")
            else:
                raise fail(f"unexpected {op!r} after {key!r}")
        if i < len(tokens):
            if tokens[i] != ",":
                raise fail(f"expected ',' but found {tokens[i]!r}")
            i += 1
            if i == len(tokens):
                raise fail("a trailing ','")
    return tuple(terms)


Fail = Callable[[str], Exception]


def _set_values(
    tokens: list[str], i: int, word: Callable[[int], str | None], fail: Fail
) -> tuple[tuple[str, ...], int]:
    """`( v1, v2, … )` starting at `tokens[i]`; returns the values and the next index."""
    if i >= len(tokens) or tokens[i] != "(":
        raise fail("'in' and 'notin' need a parenthesised list of values")
    i += 1
    values: list[str] = []
    while True:
        value = word(i)
        if value is None:
            raise fail("expected a value in the parenthesised list")
        values.append(_value(value, fail))
        i += 1
        if i < len(tokens) and tokens[i] == ",":
            i += 1
            continue
        if i < len(tokens) and tokens[i] == ")":
            return tuple(values), i + 1
        raise fail("the parenthesised list of values is not closed")


def _key(key: str, fail: Fail) -> str:
    error = label_key_error(key)
    if error:
        raise fail(error)
    return key


def _value(value: str, fail: Fail) -> str:
    error = label_value_error(value)
    if error:
        raise fail(error)
    return value

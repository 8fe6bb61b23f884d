"""`fieldSelector` and `labelSelector` on lists, watches and deletecollection (DESIGN §10).

The grammars are Kubernetes' own (k8s.io/apimachinery `fields` and `labels`):
- fieldSelector: comma-ANDed `field=value`, `field==value`, `field!=value`; `\\,`, `\\=`
  and `\\\\` escape inside values. Fields: `metadata.name`, `metadata.namespace` (the
  empty string for objects that are not namespace-scoped). Any other field → 400.
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
from typing import Any

from .errors import bad_request
from .storage import Clause

FIELDS = ("metadata.name", "metadata.namespace")
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


@dataclass(frozen=True, slots=True)
class FieldTerm:
    field: str
    equal: bool
    value: str

    def clause(self) -> Clause:
        op = "=" if self.equal else "!="
        return (f"coalesce(json_extract(o.data, ?), '') {op} ?", [f"$.{self.field}", self.value])

    def matches(self, meta: Mapping[str, Any]) -> bool:
        got = meta.get(self.field.split(".", 1)[1]) or ""
        return (got == self.value) == self.equal


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
        return all(t.matches(meta) for t in self.fields) and all(
            t.matches(labels) for t in self.labels
        )


def from_query(query: Mapping[str, str]) -> Selector:
    """The selectors of a list/watch query; 400 for a malformed or unsupported one."""
    fields = parse_field_selector(query.get("fieldSelector", ""))
    labels = parse_label_selector(query.get("labelSelector", ""))
    name = next((t.value for t in fields if t.field == "metadata.name" and t.equal), None)
    return Selector(fields, labels, name)


# -- fieldSelector ---------------------------------------------------------------------


def parse_field_selector(text: str) -> tuple[FieldTerm, ...]:
    terms: list[FieldTerm] = []
    for raw in _split_unescaped(text, ","):
        if not raw:
            continue
        for op in ("!=", "==", "="):
            at = _find_unescaped(raw, op)
            if at >= 0:
                break
        else:
            raise bad_request(f"invalid field selector {text!r}: can't understand {raw!r}")
        name, value = raw[:at], _unescape(raw[at + len(op) :], text)
        if name not in FIELDS:
            raise bad_request(
                f"field label not supported: {name!r} (supported: {', '.join(FIELDS)})"
            )
        terms.append(FieldTerm(name, op != "!=", value))
    return tuple(terms)


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


def _unescape(value: str, text: str) -> str:
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\":
            nxt = value[i + 1 : i + 2]
            if nxt not in ("\\", ",", "="):
                raise bad_request(f"invalid field selector {text!r}: bad escape in {value!r}")
            out.append(nxt)
            i += 2
            continue
        if c in ",=":
            raise bad_request(f"invalid field selector {text!r}: unescaped {c!r} in {value!r}")
        out.append(c)
        i += 1
    return "".join(out)


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

"""A Kubernetes protobuf body → the same object as Kubernetes JSON (DESIGN §10).

The body is the magic `k8s\\x00` and a `runtime.Unknown` envelope whose `typeMeta` names
the kind and whose `raw` is the object's own message. `transcode` reads it in four
steps, each refusing before the next one spends anything:

1. decode the envelope and the object with the `protobuf` package (upb, C), from the
   descriptors of descriptors.py; a body that does not decode is 400, a kind not in
   schema.KINDS is 415 naming it and asking for JSON;
2. bound it: count the entries of every list and map (`len` of upb's containers, so
   no Python object is built) and give each the smallest JSON it can have (`"",` for a
   string, the always-shown fields of a message); a body whose entries alone need more
   JSON than `max_json_bytes` is 413;
3. refuse what would silently vanish: a field that is not in the table is 415 (send
   JSON), a known field sent with the wrong wire type is 400;
4. convert: the JSON Go's encoder writes for the object (camelCase names, Go struct
   order, `omitempty`, maps with sorted keys, `bytes` as base64, times as RFC 3339,
   int-or-string, quantities as strings, inline structs flattened); a string that is
   not UTF-8 is 400. The JSON is 413 if it is still larger than `max_json_bytes`.

`Stats` counts the conversions started, so tests can tell that a refusal came before
any was built. Running large bodies away from the event loop is offload.py's job.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.protobuf import message as pb_message  # type: ignore[import-untyped, unused-ignore]
from google.protobuf.unknown_fields import (  # type: ignore[import-untyped, unused-ignore]
    UnknownFieldSet,
)

from sidecar.core import strict_json
from sidecar.core.status import StatusError
from sidecar.services.codecs.kube_protobuf.descriptors import CLASSES, TABLE, FieldSpec, full_name
from sidecar.services.codecs.kube_protobuf.schema import KINDS, OPTION_KINDS, Kind

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAX_SHOWN = 80
_ENVELOPE = "runtime.Unknown"
# Messages whose JSON is not an object of their fields.
_SPECIAL = {
    "meta.Time": "time",
    "meta.FieldsV1": "fields",
    "intstr.IntOrString": "intorstring",
    "resource.Quantity": "quantity",
    "authz.ExtraValue": "extra",
    "authn.ExtraValue": "extra",
}
# The smallest JSON of a value: `""`, `0`, `true`, `[]`/`{}`, `null`.
_MIN_SCALAR = {"s": 2, "b": 2, "bool": 4, "i32": 1, "i64": 1}
_MIN_SPECIAL = {"time": 4, "fields": 2, "intorstring": 1, "quantity": 2, "extra": 2}
_ZERO_SCALAR: dict[str, Any] = {"s": "", "b": None, "bool": False, "i32": 0, "i64": 0}
_MISSING = object()


class ProtobufError(StatusError):
    """A body `transcode` refuses: 400 (does not decode), 413 (too large), 415 (a kind
    or field the sidecar does not read)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


@dataclass
class Stats:
    """Conversions started (step 4) in this process."""

    conversions: int = 0


STATS = Stats()


@dataclass
class _Field:
    spec: FieldSpec
    sub: _Plan | None = None
    elem_cost: int = 0  # the smallest JSON one entry of a list or map adds


@dataclass
class _Plan:
    name: str
    special: str | None
    fields: list[_Field] = field(default_factory=list)
    by_number: dict[int, _Field] = field(default_factory=dict)
    walk: bool = False  # has a list or map somewhere below
    min_size: int = -1
    empty_is_bare: bool = False  # an empty message is `{}` (nothing always shown)


def _plans() -> dict[str, _Plan]:
    plans = {name: _Plan(name, _SPECIAL.get(name)) for name in TABLE}
    for name, specs in TABLE.items():
        plan = plans[name]
        for spec in specs:
            entry = _Field(spec, plans[spec.message] if spec.message else None)
            plan.fields.append(entry)
            plan.by_number[spec.number] = entry
    changed = True
    while changed:  # `walk`: a fixed point, the table may refer back through pointers
        changed = False
        for plan in plans.values():
            walk = any(
                f.spec.repeated or f.spec.map or (f.sub is not None and f.sub.walk)
                for f in plan.fields
            )
            if walk and not plan.walk:
                plan.walk = changed = True
    for plan in plans.values():
        plan.empty_is_bare = plan.special is None and _min_size(plan) == 2
        for f in plan.fields:
            if f.spec.map:
                f.elem_cost = 2 + 1 + _min_value(f) + 1  # "key":value,
            elif f.spec.repeated:
                f.elem_cost = _min_value(f) + 1
    return plans


def _min_value(f: _Field) -> int:
    if f.spec.scalar is not None:
        return _MIN_SCALAR[f.spec.scalar]
    assert f.sub is not None
    return _min_size(f.sub)


def _min_members(plan: _Plan) -> list[int]:
    """The sizes of the members every JSON of `plan` shows, whatever the body says."""
    members: list[int] = []
    for f in plan.fields:
        spec = f.spec
        if spec.inline:
            assert f.sub is not None
            members.extend(_min_members(f.sub))
            continue
        key = len(spec.name) + 3  # "name":
        if spec.repeated or spec.map:
            if spec.always:
                members.append(key + 2)
        elif spec.scalar is not None:
            if spec.always:
                members.append(key + _MIN_SCALAR[spec.scalar])
        elif not spec.pointer:  # a Go struct value is always shown
            assert f.sub is not None
            members.append(key + _min_size(f.sub))
        elif spec.always:
            assert f.sub is not None
            members.append(key + min(4, _min_size(f.sub)))
    return members


def _min_size(plan: _Plan) -> int:
    if plan.min_size < 0:
        if plan.special is not None:
            plan.min_size = _MIN_SPECIAL[plan.special]
        else:
            members = _min_members(plan)
            plan.min_size = 2 + sum(members) + max(len(members) - 1, 0)
    return plan.min_size


PLANS = _plans()


# ---- errors -----------------------------------------------------------------------------


def _shown(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


def _not_utf8() -> ProtobufError:
    return ProtobufError(400, "malformed protobuf body: a string is not valid UTF-8")


def too_large(limit: int) -> ProtobufError:
    return ProtobufError(
        413,
        f"the protobuf body holds more entries than a JSON object of at most {limit} "
        "bytes (limits.maxBodyBytes) can hold",
    )


def _unsupported_kind(kind: str, api_version: str) -> ProtobufError:
    kinds = ", ".join(sorted({k for _, k in KINDS}))
    return ProtobufError(
        415,
        f"protobuf bodies of kind {_shown(kind)} ({_shown(api_version)}) are not "
        f"supported; the sidecar reads protobuf only for {kinds}. Send the object as "
        "JSON instead.",
    )


# ---- step 1: decode ---------------------------------------------------------------------


def _parse(name: str, data: bytes, what: str) -> Any:
    msg = CLASSES[name]()
    try:
        msg.ParseFromString(data)
    except pb_message.DecodeError:
        raise ProtobufError(400, f"malformed protobuf {what}: truncated or not protobuf") from None
    return msg


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_utf8() from None


def decode_envelope(body: bytes) -> tuple[str, str, Kind, bytes]:
    """(apiVersion, kind, what the sidecar reads for it, the object's bytes)."""
    if not body.startswith(MAGIC):
        raise ProtobufError(
            400, "not a Kubernetes protobuf body: it does not start with the k8s\\x00 prefix"
        )
    envelope = _parse(_ENVELOPE, body[len(MAGIC) :], "envelope")
    api_version = _text(envelope.typeMeta.apiVersion)
    kind = _text(envelope.typeMeta.kind)
    if not kind or not api_version:
        raise ProtobufError(400, "not a Kubernetes protobuf envelope: no apiVersion/kind")
    if not envelope.raw and kind not in OPTION_KINDS:  # options may all be defaults
        raise ProtobufError(400, "malformed protobuf envelope: it carries no object")
    if envelope.contentEncoding:
        shown = _shown(_text(envelope.contentEncoding))
        raise ProtobufError(415, f"protobuf content encoding {shown!r} is not supported")
    if envelope.contentType not in (b"", MEDIA_TYPE.encode()):
        shown = _shown(_text(envelope.contentType))
        raise ProtobufError(415, f"protobuf envelope content type {shown!r} is not supported")
    found = KINDS.get((api_version, kind))
    if found is None:
        raise _unsupported_kind(kind, api_version)
    return api_version, kind, found, envelope.raw


def read_kind(body: bytes) -> str:
    """The kind a body claims (its envelope only; the same refusals as `transcode`)."""
    return decode_envelope(body)[1]


# ---- step 2: bound ----------------------------------------------------------------------


def check_bound(plan: _Plan, msg: Any, budget: int) -> int:
    """What is left of `budget` once every list and map entry below `msg` is given its
    smallest JSON; 413 as soon as nothing is left. Only `len` of upb's containers and
    the messages in them are visited: nothing is converted."""
    for fd, value in msg.ListFields():
        f = plan.by_number[fd.number]
        sub = f.sub
        if f.spec.repeated or f.spec.map:
            budget -= len(value) * f.elem_cost
            if budget < 0:
                raise _BoundExceeded
            if sub is not None and sub.walk:
                for item in value:
                    if f.spec.map:
                        if item.HasField("value"):
                            budget = check_bound(sub, item.value, budget)
                    else:
                        budget = check_bound(sub, item, budget)
        elif sub is not None and sub.walk:
            budget = check_bound(sub, value, budget)
    return budget


class _BoundExceeded(Exception):
    pass


def count_parts(decoded: Decoded, limit: int) -> int:
    """The parts of the whole object, every message and every list or map entry in it,
    counted only until there are more than `limit` (so counting costs at most about
    `limit` steps). Converting costs a few microseconds a part, whatever its bytes: a
    3 KB ConfigMap of one value is three parts, 2 KB of probes and handlers is
    hundreds (offload.py decides by this where a body is converted)."""
    return _count(PLANS[decoded.found.message], decoded.msg, limit)


def _count(plan: _Plan, msg: Any, limit: int) -> int:
    count = 0
    for fd, value in msg.ListFields():
        f = plan.by_number[fd.number]
        sub = f.sub
        if f.spec.repeated or f.spec.map:
            count += len(value)
            if count > limit:
                return count
            if sub is None or sub.special is not None:
                continue
            for item in value:
                if f.spec.map:
                    if not item.HasField("value"):
                        continue
                    item = item.value
                count += _count(sub, item, limit - count)
                if count > limit:
                    return count
        elif sub is not None:
            count += 1
            if sub.special is None:
                count += _count(sub, value, limit - count)
            if count > limit:
                return count
    return count


# ---- step 3: nothing vanishes -------------------------------------------------------------


def _first_unknown(plan: _Plan, msg: Any, path: str) -> tuple[_Plan, int, int, str] | None:
    unknown = UnknownFieldSet(msg)
    if len(unknown):
        first = unknown[0]
        return plan, first.field_number, first.wire_type, path
    for fd, value in msg.ListFields():
        f = plan.by_number[fd.number]
        if f.sub is None or f.sub.special == "time":
            continue
        items = list(value) if (f.spec.repeated or f.spec.map) else [value]
        for index, item in enumerate(items):
            where = f"{path}.{f.spec.name}" + (f"[{index}]" if f.spec.repeated else "")
            if f.spec.map:
                found = _first_unknown(f.sub, item.value, f"{path}.{f.spec.name}[{index}]")
            else:
                found = _first_unknown(f.sub, item, where)
            if found:
                return found
    return None


def check_known(plan: _Plan, msg: Any, raw: bytes) -> None:
    """415 for a field the table does not know, 400 for a known one with the wrong wire
    type (protobuf keeps both as unknown fields, which Go would drop silently)."""
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    if msg.ByteSize() == size:
        return
    found = _first_unknown(plan, _parse(plan.name, raw, "object"), "")
    if found is None:  # sizes differ, so there is one; be safe all the same
        raise ProtobufError(415, "the protobuf body has fields the sidecar does not read")
    where, number, wire_type, path = found
    known = where.by_number.get(number)
    at = f" (at {path.lstrip('.')})" if path else ""
    if known is not None:
        raise ProtobufError(
            400,
            f"malformed protobuf body: field {known.spec.name} of {full_name(where.name)}{at} "
            f"has wire type {wire_type}",
        )
    raise ProtobufError(
        415,
        f"protobuf field {number} of {full_name(where.name)}{at} is not one the sidecar "
        "reads, and dropping it could change the object. Send the object as JSON "
        "instead.",
    )


# ---- step 4: convert --------------------------------------------------------------------


def _time(msg: Any) -> str | None:
    # metav1.Time: an empty message is the zero time (JSON null); Go keeps whole seconds.
    if not msg.ListFields():
        return None
    try:
        moment = datetime.fromtimestamp(msg.seconds, UTC)
    except (OverflowError, OSError, ValueError):
        raise ProtobufError(400, f"timestamp out of range: {msg.seconds} seconds") from None
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}Z"
    )


def _fields(msg: Any) -> dict[str, Any]:
    # FieldsV1 carries its JSON object in `Raw`.
    try:
        value = strict_json.loads(msg.Raw) if msg.Raw else {}
    except strict_json.NotJsonNumber as exc:
        raise ProtobufError(400, f"managedFields: fieldsV1: {exc}") from None
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise ProtobufError(400, "managedFields: fieldsV1 is not a JSON object")
    return value


def _int_or_string(msg: Any) -> int | str:
    if msg.type == 0:
        return int(msg.intVal)
    if msg.type == 1:
        return _text(msg.strVal)
    raise ProtobufError(400, f"malformed protobuf body: IntOrString of type {msg.type}")


_SPECIALS: dict[str, Any] = {
    "time": _time,
    "fields": _fields,
    "intorstring": _int_or_string,
    "quantity": lambda msg: _text(msg.string) if msg.HasField("string") else "0",
    "extra": lambda msg: [_text(v) for v in msg.items],  # ExtraValue is a plain list
}


def _scalar(kind: str, value: Any) -> Any:
    if kind == "s":
        return _text(value)
    if kind == "b":
        return base64.b64encode(value).decode("ascii")
    return value


def _value(f: _Field, value: Any) -> Any:
    if f.sub is None:
        assert f.spec.scalar is not None
        return _scalar(f.spec.scalar, value)
    return convert(f.sub, value)


def _zero(plan: _Plan) -> Any:
    return convert(plan, CLASSES[plan.name]())


def convert(plan: _Plan, msg: Any) -> Any:
    """The JSON value Go's encoder writes for `msg` (a message of `plan`)."""
    if plan.special is not None:
        return _SPECIALS[plan.special](msg)
    listed = msg.ListFields()
    if not listed and plan.empty_is_bare:
        return {}
    present = {fd.number: value for fd, value in listed}
    out: dict[str, Any] = {}
    for f in plan.fields:
        spec = f.spec
        value = present.get(spec.number, _MISSING)
        if spec.inline:
            assert f.sub is not None
            out.update(convert(f.sub, value) if value is not _MISSING else _zero(f.sub))
        elif spec.map:
            if value is _MISSING:
                if spec.always:
                    out[spec.name] = None
                continue
            entries: dict[str, Any] = {}
            for entry in value:  # the last entry of a key wins, as in Go
                if f.sub is not None:
                    item = convert(f.sub, entry.value) if entry.HasField("value") else _zero(f.sub)
                else:
                    assert spec.scalar is not None
                    item = _scalar(spec.scalar, entry.value)
                entries[_text(entry.key)] = item
            out[spec.name] = dict(sorted(entries.items()))  # Go sorts map keys
        elif spec.repeated:
            if value is _MISSING:
                if spec.always:
                    out[spec.name] = None
                continue
            out[spec.name] = [_value(f, item) for item in value]
        elif value is not _MISSING:
            if f.sub is not None or value or spec.pointer or spec.always:
                out[spec.name] = _value(f, value)
        elif f.sub is not None and not spec.pointer:  # a Go struct value: always shown
            out[spec.name] = _zero(f.sub)
        elif spec.always:
            if spec.pointer or f.sub is not None:
                out[spec.name] = None
            else:
                assert spec.scalar is not None
                out[spec.name] = _ZERO_SCALAR[spec.scalar]
    return out


# ---- the whole -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Transcoded:
    """A body read: its kind, the object as JSON bytes (`data`) and, when it was read
    in this process, as a JSON object (`document`)."""

    kind: str
    data: bytes
    document: dict[str, Any] | None = None


@dataclass(frozen=True)
class Decoded:
    """A body after step 1: its envelope read and its object parsed by upb."""

    api_version: str
    kind: str
    found: Kind
    raw: bytes
    msg: Any


def decode(body: bytes) -> Decoded:
    """Step 1 (400 for a body that does not decode, 415 for a kind not read)."""
    api_version, kind, found, raw = decode_envelope(body)
    return Decoded(api_version, kind, found, raw, _parse(found.message, raw, kind))


def finish(decoded: Decoded, max_json_bytes: int | None = None) -> Transcoded:
    """Steps 2 to 4 of a decoded body (`transcode` says what is refused)."""
    plan = PLANS[decoded.found.message]
    msg = decoded.msg
    if max_json_bytes is not None:
        try:
            check_bound(plan, msg, max_json_bytes)
        except _BoundExceeded:
            raise too_large(max_json_bytes) from None
    check_known(plan, msg, decoded.raw)
    STATS.conversions += 1
    document = {"kind": decoded.kind, "apiVersion": decoded.api_version, **convert(plan, msg)}
    data = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    if max_json_bytes is not None and len(data) > max_json_bytes:
        raise ProtobufError(
            413,
            f"the object is {len(data)} bytes as JSON, more than the limit of "
            f"{max_json_bytes} bytes (limits.maxBodyBytes)",
        )
    return Transcoded(decoded.kind, data, document)


def transcode(body: bytes, max_json_bytes: int | None = None) -> Transcoded:
    """A Kubernetes protobuf body → the same object as Kubernetes JSON.

    Raises `ProtobufError` (a `StatusError`): 400 for a body that does not decode, 413
    for one whose JSON could not fit in `max_json_bytes`, 415 for a kind, encoding or
    field the sidecar does not read.
    """
    return finish(decode(body), max_json_bytes)

"""schema.py's table compiled into protobuf descriptors and message classes.

One `FileDescriptorProto` per API package (proto2, as the published generated.proto
files), added to a private descriptor pool; `message_factory` makes the classes, and
the `protobuf` package (upb) does all wire decoding. Two choices differ from the
generated files, both so that nothing is decided behind the codec's back:

- string fields are declared `bytes`, so that the codec checks UTF-8 itself (a 400,
  whatever protobuf runtime is installed);
- a map is declared as the repeated `<Name>Entry {key = 1; value = 2}` message it is on
  the wire, without the `map_entry` option: every entry on the wire stays countable
  (the size bound counts them before anything is built), and the codec applies the
  map rule (the last entry of a key wins), as Go's decoder does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import (  # type: ignore[import-untyped, unused-ignore]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

from sidecar.services.codecs.kube_protobuf.schema import MESSAGES, PACKAGES

SCALARS: dict[str, int] = {
    "s": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "b": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "i32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "i64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
}
_FLAGS = frozenset("*!^")


@dataclass(frozen=True)
class FieldSpec:
    """One field of schema.py's table."""

    name: str
    number: int
    scalar: str | None  # a key of SCALARS, or None for a message
    message: str | None  # "pkg.Name" of a message field (or a map's value message)
    repeated: bool
    map: bool
    pointer: bool  # `*`
    always: bool  # `!`
    inline: bool  # `^`


def _parse_field(package: str, line: str) -> FieldSpec:
    parts = line.split()
    if len(parts) not in (3, 4) or (len(parts) == 4 and not set(parts[3]) <= _FLAGS):
        raise ValueError(f"schema: bad field line {line!r} in {package}")
    name, number, type_name = parts[0], int(parts[1]), parts[2]
    flags = parts[3] if len(parts) == 4 else ""
    repeated = type_name.startswith("[") and type_name.endswith("]")
    is_map = type_name.startswith("{") and type_name.endswith("}")
    inner = type_name[1:-1] if repeated or is_map else type_name
    scalar = inner if inner in SCALARS else None
    message = None if scalar else (inner if "." in inner else f"{package}.{inner}")
    return FieldSpec(
        name=name,
        number=number,
        scalar=scalar,
        message=message,
        repeated=repeated,
        map=is_map,
        pointer="*" in flags,
        always="!" in flags,
        inline="^" in flags,
    )


def parse_table() -> dict[str, list[FieldSpec]]:
    """schema.py's MESSAGES as {"pkg.Name": [FieldSpec, ...]} (fields in Go order)."""
    table: dict[str, list[FieldSpec]] = {}
    for package, text in MESSAGES.items():
        current: list[FieldSpec] | None = None
        for raw in text.splitlines():
            if not raw.strip():
                continue
            if not raw[0].isspace():
                current = table.setdefault(f"{package}.{raw.strip()}", [])
            elif current is None:
                raise ValueError(f"schema: field before any message in {package}")
            else:
                current.append(_parse_field(package, raw))
    for name, fields in table.items():
        numbers = [f.number for f in fields]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"schema: duplicate field number in {name}")
        for f in fields:
            if f.message is not None and f.message not in table:
                raise ValueError(f"schema: {name}.{f.name} names unknown {f.message}")
    return table


TABLE = parse_table()


def full_name(name: str) -> str:
    """ "pkg.Name" → the protobuf full name (k8s.io.api.core.v1.Name)."""
    package, _, message = name.partition(".")
    return f"{PACKAGES[package]}.{message}"


def entry_name(field: FieldSpec) -> str:
    return field.name[0].upper() + field.name[1:] + "Entry"


def _add_field(msg: Any, number: int, name: str, scalar: str | None, message: str | None) -> Any:
    field = msg.field.add(name=name, number=number, json_name=name)
    field.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    if scalar is not None:
        field.type = SCALARS[scalar]
    else:
        assert message is not None
        field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
        field.type_name = f".{full_name(message)}"
    return field


def _file(package: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"{PACKAGES[package].replace('.', '/')}/generated.proto",
        package=PACKAGES[package],
        syntax="proto2",
    )
    deps: set[str] = set()
    for name, fields in TABLE.items():
        if not name.startswith(f"{package}."):
            continue
        msg = proto.message_type.add(name=name.partition(".")[2])
        for f in fields:
            if f.message is not None and not f.message.startswith(f"{package}."):
                deps.add(f.message.partition(".")[0])
            if f.map:
                entry = msg.nested_type.add(name=entry_name(f))
                _add_field(entry, 1, "key", "s", None)
                _add_field(entry, 2, "value", f.scalar, f.message)
                field = msg.field.add(name=f.name, number=f.number, json_name=f.name)
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                field.type_name = f".{full_name(name)}.{entry.name}"
            else:
                field = _add_field(msg, f.number, f.name, f.scalar, f.message)
            if f.repeated or f.map:
                field.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    proto.dependency.extend(
        f"{PACKAGES[dep].replace('.', '/')}/generated.proto" for dep in sorted(deps)
    )
    return proto


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    files = {package: _file(package) for package in PACKAGES}
    added: set[str] = set()

    def add(package: str) -> None:
        if package in added:
            return
        added.add(package)
        for dep in files[package].dependency:
            add(next(p for p, f in files.items() if f.name == dep))
        pool.Add(files[package])

    for package in PACKAGES:
        add(package)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name(name)))
        for name in TABLE
    }


CLASSES: dict[str, Any] = _build()

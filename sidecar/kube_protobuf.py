"""Kubernetes protobuf request bodies, transcoded to Kubernetes JSON (DESIGN §10).

kubectl's typed commands (`create configmap|secret|namespace|serviceaccount`, `auth
can-i`, `auth whoami`) send `application/vnd.kubernetes.protobuf` bodies and do not fall
back to JSON on a 415. Such a body is the magic `k8s\\x00` followed by a `runtime.Unknown`
envelope whose `typeMeta` names the kind and whose `raw` is the object's own message.

`transcode` decodes the envelope and, for the kinds the sidecar handles, the object
with the `protobuf` package, from descriptors built here out of the published field
numbers (k8s.io/apimachinery runtime and meta/v1, k8s.io/api core/v1, authorization/v1,
authentication/v1 generated.proto), and returns the JSON the Kubernetes API would show
for it: camelCase names, maps as objects, `bytes` as base64, times as RFC 3339, Go's
`omitempty` for zero values (kept where the zero value means something). Another kind
is a 415 naming it; a body that is not such an envelope, or does not decode, is a 400.
Fields not in the schema below are dropped, as the Kubernetes protobuf decoder does.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from google.protobuf import (  # type: ignore[import-untyped, unused-ignore]
    descriptor_pb2,
    descriptor_pool,
    message,
    message_factory,
)

from sidecar.errors import StatusError

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"

_RUNTIME = "k8s.io.apimachinery.pkg.runtime"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1"
_CORE = "k8s.io.api.core.v1"
_AUTHZ = "k8s.io.api.authorization.v1"
_AUTHN = "k8s.io.api.authentication.v1"

# One row per field: (name, number, type). A type is a scalar (string, bytes, bool,
# int32, int64) or a message's full name; "repeated T" and "map<string, T>" as in .proto.
# Rows are in the order the Kubernetes JSON shows the fields.
_Row = tuple[str, int, str]
_FILES: dict[str, tuple[str, list[str], dict[str, list[_Row]]]] = {
    _RUNTIME: (
        "k8s.io/apimachinery/pkg/runtime/generated.proto",
        [],
        {
            "TypeMeta": [("apiVersion", 1, "string"), ("kind", 2, "string")],
            "Unknown": [
                ("typeMeta", 1, f"{_RUNTIME}.TypeMeta"),
                ("raw", 2, "bytes"),
                ("contentEncoding", 3, "string"),
                ("contentType", 4, "string"),
            ],
        },
    ),
    _META: (
        "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
        [],
        {
            "Time": [("seconds", 1, "int64"), ("nanos", 2, "int32")],
            "FieldsV1": [("Raw", 1, "bytes")],
            "OwnerReference": [
                ("apiVersion", 5, "string"),
                ("kind", 1, "string"),
                ("name", 3, "string"),
                ("uid", 4, "string"),
                ("controller", 6, "bool"),
                ("blockOwnerDeletion", 7, "bool"),
            ],
            "ManagedFieldsEntry": [
                ("manager", 1, "string"),
                ("operation", 2, "string"),
                ("apiVersion", 3, "string"),
                ("time", 4, f"{_META}.Time"),
                ("fieldsType", 6, "string"),
                ("fieldsV1", 7, f"{_META}.FieldsV1"),
                ("subresource", 8, "string"),
            ],
            "ObjectMeta": [
                ("name", 1, "string"),
                ("generateName", 2, "string"),
                ("namespace", 3, "string"),
                ("selfLink", 4, "string"),
                ("uid", 5, "string"),
                ("resourceVersion", 6, "string"),
                ("generation", 7, "int64"),
                ("creationTimestamp", 8, f"{_META}.Time"),
                ("deletionTimestamp", 9, f"{_META}.Time"),
                ("deletionGracePeriodSeconds", 10, "int64"),
                ("labels", 11, "map<string, string>"),
                ("annotations", 12, "map<string, string>"),
                ("ownerReferences", 13, f"repeated {_META}.OwnerReference"),
                ("finalizers", 14, "repeated string"),
                ("managedFields", 17, f"repeated {_META}.ManagedFieldsEntry"),
            ],
            "LabelSelectorRequirement": [
                ("key", 1, "string"),
                ("operator", 2, "string"),
                ("values", 3, "repeated string"),
            ],
        },
    ),
    _CORE: (
        "k8s.io/api/core/v1/generated.proto",
        [_META],
        {
            "ObjectReference": [
                ("kind", 1, "string"),
                ("namespace", 2, "string"),
                ("name", 3, "string"),
                ("uid", 4, "string"),
                ("apiVersion", 5, "string"),
                ("resourceVersion", 6, "string"),
                ("fieldPath", 7, "string"),
            ],
            "LocalObjectReference": [("name", 1, "string")],
            "ConfigMap": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("immutable", 4, "bool"),
                ("data", 2, "map<string, string>"),
                ("binaryData", 3, "map<string, bytes>"),
            ],
            "Secret": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("immutable", 5, "bool"),
                ("data", 2, "map<string, bytes>"),
                ("stringData", 4, "map<string, string>"),
                ("type", 3, "string"),
            ],
            "NamespaceSpec": [("finalizers", 1, "repeated string")],
            "NamespaceCondition": [
                ("type", 1, "string"),
                ("status", 2, "string"),
                ("lastTransitionTime", 4, f"{_META}.Time"),
                ("reason", 5, "string"),
                ("message", 6, "string"),
            ],
            "NamespaceStatus": [
                ("phase", 1, "string"),
                ("conditions", 2, f"repeated {_CORE}.NamespaceCondition"),
            ],
            "Namespace": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("spec", 2, f"{_CORE}.NamespaceSpec"),
                ("status", 3, f"{_CORE}.NamespaceStatus"),
            ],
            "ServiceAccount": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("secrets", 2, f"repeated {_CORE}.ObjectReference"),
                ("imagePullSecrets", 3, f"repeated {_CORE}.LocalObjectReference"),
                ("automountServiceAccountToken", 4, "bool"),
            ],
        },
    ),
    _AUTHZ: (
        "k8s.io/api/authorization/v1/generated.proto",
        [_META],
        {
            "ExtraValue": [("items", 1, "repeated string")],
            "FieldSelectorRequirement": [
                ("key", 1, "string"),
                ("operator", 2, "string"),
                ("values", 3, "repeated string"),
            ],
            "FieldSelectorAttributes": [
                ("rawSelector", 1, "string"),
                ("requirements", 2, f"repeated {_AUTHZ}.FieldSelectorRequirement"),
            ],
            "LabelSelectorAttributes": [
                ("rawSelector", 1, "string"),
                ("requirements", 2, f"repeated {_META}.LabelSelectorRequirement"),
            ],
            "ResourceAttributes": [
                ("namespace", 1, "string"),
                ("verb", 2, "string"),
                ("group", 3, "string"),
                ("version", 4, "string"),
                ("resource", 5, "string"),
                ("subresource", 6, "string"),
                ("name", 7, "string"),
                ("fieldSelector", 8, f"{_AUTHZ}.FieldSelectorAttributes"),
                ("labelSelector", 9, f"{_AUTHZ}.LabelSelectorAttributes"),
            ],
            "NonResourceAttributes": [("path", 1, "string"), ("verb", 2, "string")],
            "SelfSubjectAccessReviewSpec": [
                ("resourceAttributes", 1, f"{_AUTHZ}.ResourceAttributes"),
                ("nonResourceAttributes", 2, f"{_AUTHZ}.NonResourceAttributes"),
            ],
            "SubjectAccessReviewSpec": [
                ("resourceAttributes", 1, f"{_AUTHZ}.ResourceAttributes"),
                ("nonResourceAttributes", 2, f"{_AUTHZ}.NonResourceAttributes"),
                ("user", 3, "string"),
                ("groups", 4, "repeated string"),
                ("extra", 5, f"map<string, {_AUTHZ}.ExtraValue>"),
                ("uid", 6, "string"),
            ],
            "SubjectAccessReviewStatus": [
                ("allowed", 1, "bool"),
                ("denied", 4, "bool"),
                ("reason", 2, "string"),
                ("evaluationError", 3, "string"),
            ],
            "SelfSubjectAccessReview": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("spec", 2, f"{_AUTHZ}.SelfSubjectAccessReviewSpec"),
                ("status", 3, f"{_AUTHZ}.SubjectAccessReviewStatus"),
            ],
            "SubjectAccessReview": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("spec", 2, f"{_AUTHZ}.SubjectAccessReviewSpec"),
                ("status", 3, f"{_AUTHZ}.SubjectAccessReviewStatus"),
            ],
            "SelfSubjectRulesReviewSpec": [("namespace", 1, "string")],
            "ResourceRule": [
                ("verbs", 1, "repeated string"),
                ("apiGroups", 2, "repeated string"),
                ("resources", 3, "repeated string"),
                ("resourceNames", 4, "repeated string"),
            ],
            "NonResourceRule": [
                ("verbs", 1, "repeated string"),
                ("nonResourceURLs", 2, "repeated string"),
            ],
            "SubjectRulesReviewStatus": [
                ("resourceRules", 1, f"repeated {_AUTHZ}.ResourceRule"),
                ("nonResourceRules", 2, f"repeated {_AUTHZ}.NonResourceRule"),
                ("incomplete", 3, "bool"),
                ("evaluationError", 4, "string"),
            ],
            "SelfSubjectRulesReview": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("spec", 2, f"{_AUTHZ}.SelfSubjectRulesReviewSpec"),
                ("status", 3, f"{_AUTHZ}.SubjectRulesReviewStatus"),
            ],
        },
    ),
    _AUTHN: (
        "k8s.io/api/authentication/v1/generated.proto",
        [_META],
        {
            "ExtraValue": [("items", 1, "repeated string")],
            "UserInfo": [
                ("username", 1, "string"),
                ("uid", 2, "string"),
                ("groups", 3, "repeated string"),
                ("extra", 4, f"map<string, {_AUTHN}.ExtraValue>"),
            ],
            "SelfSubjectReviewStatus": [("userInfo", 1, f"{_AUTHN}.UserInfo")],
            "SelfSubjectReview": [
                ("metadata", 1, f"{_META}.ObjectMeta"),
                ("status", 2, f"{_AUTHN}.SelfSubjectReviewStatus"),
            ],
        },
    ),
}

# (apiVersion, kind) of the bodies the sidecar reads → the object's message.
KINDS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): f"{_CORE}.ConfigMap",
    ("v1", "Secret"): f"{_CORE}.Secret",
    ("v1", "Namespace"): f"{_CORE}.Namespace",
    ("v1", "ServiceAccount"): f"{_CORE}.ServiceAccount",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): f"{_AUTHZ}.SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SubjectAccessReview"): f"{_AUTHZ}.SubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): f"{_AUTHZ}.SelfSubjectRulesReview",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): f"{_AUTHN}.SelfSubjectReview",
}

# Go writes every non-pointer field on the protobuf wire, zero or not, and omits zero
# values from JSON (`omitempty`); these fields are pointers or have no `omitempty`, so a
# zero value that is on the wire is shown.
_KEEP_ZERO = frozenset(
    {
        f"{_CORE}.ConfigMap.immutable",
        f"{_CORE}.Secret.immutable",
        f"{_CORE}.ServiceAccount.automountServiceAccountToken",
        f"{_META}.ObjectMeta.deletionGracePeriodSeconds",
        f"{_META}.OwnerReference.controller",
        f"{_META}.OwnerReference.blockOwnerDeletion",
        f"{_AUTHZ}.SubjectAccessReviewStatus.allowed",
        f"{_AUTHZ}.SubjectRulesReviewStatus.incomplete",
    }
)

_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
}
_MAX_NAME = 80


class ProtobufError(StatusError):
    """A body `transcode` cannot read: 415 for a kind it does not handle, else 400."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


def _set_type(field: Any, type_name: str) -> None:
    if type_name in _SCALARS:
        field.type = _SCALARS[type_name]
    else:
        field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
        field.type_name = f".{type_name}"


def _add_field(msg: Any, package: str, name: str, number: int, type_name: str) -> None:
    field = msg.field.add(name=name, number=number, json_name=name)
    field.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    if type_name.startswith("repeated "):
        field.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
        _set_type(field, type_name.removeprefix("repeated "))
    elif type_name.startswith("map<string, "):
        # A map is a repeated nested `<Name>Entry {key = 1; value = 2}` marked map_entry.
        entry = msg.nested_type.add(name=name[0].upper() + name[1:] + "Entry")
        entry.options.map_entry = True
        _add_field(entry, package, "key", 1, "string")
        _add_field(entry, package, "value", 2, type_name.removeprefix("map<string, ")[:-1])
        field.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
        field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
        field.type_name = f".{package}.{msg.name}.{entry.name}"
    else:
        _set_type(field, type_name)


def _build() -> dict[str, Any]:
    """The message classes, by full name, from a private descriptor pool."""
    pool = descriptor_pool.DescriptorPool()
    file_names = {package: spec[0] for package, spec in _FILES.items()}
    for package, (file_name, deps, messages) in _FILES.items():
        proto = descriptor_pb2.FileDescriptorProto(
            name=file_name,
            package=package,
            syntax="proto2",
            dependency=[file_names[dep] for dep in deps],
        )
        for msg_name, rows in messages.items():
            msg = proto.message_type.add(name=msg_name)
            for field_name, number, type_name in rows:
                _add_field(msg, package, field_name, number, type_name)
        pool.Add(proto)
    return {
        f"{package}.{name}": message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{package}.{name}")
        )
        for package, (_, _, messages) in _FILES.items()
        for name in messages
    }


_CLASSES = _build()
_ROWS = {
    f"{package}.{name}": rows
    for package, (_, _, messages) in _FILES.items()
    for name, rows in messages.items()
}


def _time(msg: Any) -> str | None:
    # metav1.Time: an empty message is the zero time, which Kubernetes JSON shows as null.
    if not msg.HasField("seconds") and not msg.HasField("nanos"):
        return None
    try:
        moment = datetime.fromtimestamp(msg.seconds, UTC)
    except (OverflowError, OSError, ValueError):
        raise ProtobufError(400, f"timestamp out of range: {msg.seconds} seconds") from None
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value: Any) -> str:
    # upb hands back a proto2 string that is not UTF-8 as bytes; other runtimes raise.
    if not isinstance(value, str):
        raise ProtobufError(400, "malformed protobuf body: a string is not UTF-8")
    return value


def _value(type_name: str, value: Any) -> Any:
    if type_name == "string":
        return _text(value)
    if type_name == "bytes":
        return base64.b64encode(value).decode("ascii")
    if type_name == f"{_META}.FieldsV1":
        # FieldsV1 carries its JSON object in `Raw`.
        try:
            fields = json.loads(value.Raw) if value.Raw else {}
        except (ValueError, RecursionError):
            fields = None
        if not isinstance(fields, dict):
            raise ProtobufError(400, "managedFields: fieldsV1 is not a JSON object")
        return fields
    if type_name in (f"{_AUTHZ}.ExtraValue", f"{_AUTHN}.ExtraValue"):
        return list(value.items)  # Kubernetes JSON shows ExtraValue as a plain list
    if type_name in _ROWS:
        return _object(type_name, value)
    return value


def _object(full_name: str, msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, _, type_name in _ROWS[full_name]:
        if type_name.startswith("map<string, "):
            value_type = type_name.removeprefix("map<string, ")[:-1]
            entries = getattr(msg, name)
            if entries:
                pairs = {_text(key): _value(value_type, v) for key, v in entries.items()}
                out[name] = dict(sorted(pairs.items()))  # Go's JSON sorts map keys
        elif type_name.startswith("repeated "):
            items = getattr(msg, name)
            if items:
                out[name] = [_value(type_name.removeprefix("repeated "), v) for v in items]
        elif not msg.HasField(name):
            continue
        elif type_name == f"{_META}.Time":
            moment = _time(getattr(msg, name))
            if moment is not None:
                out[name] = moment
        elif type_name in _ROWS:
            out[name] = _value(type_name, getattr(msg, name))
        else:
            value = getattr(msg, name)
            if value or f"{full_name}.{name}" in _KEEP_ZERO:
                out[name] = _value(type_name, value)
    return out


def _parse(full_name: str, data: bytes, what: str) -> Any:
    msg = _CLASSES[full_name]()
    try:
        msg.ParseFromString(data)
    except message.DecodeError:
        raise ProtobufError(400, f"malformed protobuf {what}: truncated or not protobuf") from None
    return msg


def _shown(text: str) -> str:
    return text if len(text) <= _MAX_NAME else text[:_MAX_NAME] + "..."


def transcode(body: bytes) -> tuple[str, bytes]:
    """A Kubernetes protobuf body → (kind, the same object as Kubernetes JSON bytes).

    Raises `ProtobufError` (a `StatusError`): 400 for a body that is not a Kubernetes
    protobuf envelope or does not decode, 415 for a kind (or encoding) not handled here.
    """
    if not body.startswith(MAGIC):
        raise ProtobufError(
            400, "not a Kubernetes protobuf body: it does not start with the k8s\\x00 prefix"
        )
    try:
        envelope = _parse(f"{_RUNTIME}.Unknown", body[len(MAGIC) :], "envelope")
        api_version = _text(envelope.typeMeta.apiVersion)
        kind = _text(envelope.typeMeta.kind)
        if not kind or not api_version:
            raise ProtobufError(400, "not a Kubernetes protobuf envelope: no apiVersion/kind")
        if not envelope.raw:
            raise ProtobufError(400, "malformed protobuf envelope: it carries no object")
        if envelope.contentEncoding:
            raise ProtobufError(
                415,
                f"protobuf content encoding {_shown(_text(envelope.contentEncoding))!r} "
                "is not supported",
            )
        if envelope.contentType not in ("", MEDIA_TYPE):
            raise ProtobufError(
                415,
                f"protobuf envelope content type {_shown(_text(envelope.contentType))!r} "
                "is not supported",
            )
        full_name = KINDS.get((api_version, kind))
        if full_name is None:
            raise ProtobufError(
                415,
                f"protobuf bodies of kind {_shown(kind)} ({_shown(api_version)}) are not "
                "supported; the sidecar reads protobuf only for ConfigMap, Secret, "
                "Namespace, ServiceAccount and the access reviews. Send the object as "
                "JSON instead, e.g. `kubectl create -f object.json`.",
            )
        obj = _object(full_name, _parse(full_name, envelope.raw, kind))
    except UnicodeDecodeError:
        raise ProtobufError(400, "malformed protobuf body: a string is not UTF-8") from None
    document = {"kind": kind, "apiVersion": api_version, **obj}
    return kind, json.dumps(document, separators=(",", ":")).encode()

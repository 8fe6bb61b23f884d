"""Envoy's gRPC ext_authz messages (`envoy.service.auth.v3.Authorization/Check`, as
Istio's `envoyExtAuthzGrpc` and OPA-Envoy use), trimmed to the fields the decider
reads and answers, with the published field numbers (envoyproxy/envoy
`api/envoy/service/auth/v3/{external_auth,attribute_context}.proto`,
`api/envoy/config/core/v3/{address,base}.proto`, `api/envoy/type/v3/http_status.proto`,
`google/rpc/status.proto`). Fields left out are skipped by the protobuf decoder, as
unknown fields are. Built at import from descriptors (no generated code).

Enums are declared as `int32`: the same varint on the wire.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import (  # type: ignore[import-untyped, unused-ignore]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT32, _UINT32, _BYTES, _MSG, _BOOL = (
    _F.TYPE_STRING,
    _F.TYPE_INT32,
    _F.TYPE_UINT32,
    _F.TYPE_BYTES,
    _F.TYPE_MESSAGE,
    _F.TYPE_BOOL,
)
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _message(
    file: descriptor_pb2.FileDescriptorProto | descriptor_pb2.DescriptorProto,
    name: str,
    fields: list[tuple[str, int, int, int, str]],
    *,
    map_entry: bool = False,
) -> descriptor_pb2.DescriptorProto:
    msg = (
        file.message_type.add()
        if isinstance(file, descriptor_pb2.FileDescriptorProto)
        else file.nested_type.add()
    )
    msg.name = name
    if map_entry:
        msg.options.map_entry = True
    for fname, number, ftype, label, type_name in fields:
        f = msg.field.add()
        f.name, f.number, f.type, f.label = fname, number, ftype, label
        if type_name:
            f.type_name = type_name
    return msg


def _build() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto()
    fd.name = "sidecar/envoy_ext_authz_trimmed.proto"
    fd.package = "envoy.service.auth.v3"
    fd.syntax = "proto3"
    p = ".envoy.service.auth.v3."
    _message(
        fd,
        "SocketAddress",
        [("address", 2, _STRING, _OPTIONAL, ""), ("port_value", 3, _UINT32, _OPTIONAL, "")],
    )
    _message(fd, "Address", [("socket_address", 1, _MSG, _OPTIONAL, p + "SocketAddress")])
    _message(fd, "Peer", [("address", 1, _MSG, _OPTIONAL, p + "Address")])
    _message(
        fd,
        "HeaderValue",
        [
            ("key", 1, _STRING, _OPTIONAL, ""),
            ("value", 2, _STRING, _OPTIONAL, ""),
            ("raw_value", 3, _BYTES, _OPTIONAL, ""),
        ],
    )
    _message(fd, "HeaderMap", [("headers", 1, _MSG, _REPEATED, p + "HeaderValue")])
    http = _message(
        fd,
        "HttpRequest",
        [
            ("id", 1, _STRING, _OPTIONAL, ""),
            ("method", 2, _STRING, _OPTIONAL, ""),
            ("headers", 3, _MSG, _REPEATED, p + "HttpRequest.HeadersEntry"),
            ("path", 4, _STRING, _OPTIONAL, ""),
            ("host", 5, _STRING, _OPTIONAL, ""),
            ("header_map", 13, _MSG, _OPTIONAL, p + "HeaderMap"),
        ],
    )
    _message(
        http,
        "HeadersEntry",
        [("key", 1, _STRING, _OPTIONAL, ""), ("value", 2, _STRING, _OPTIONAL, "")],
        map_entry=True,
    )
    _message(fd, "Request", [("http", 2, _MSG, _OPTIONAL, p + "HttpRequest")])
    _message(
        fd,
        "AttributeContext",
        [
            ("source", 1, _MSG, _OPTIONAL, p + "Peer"),
            ("destination", 2, _MSG, _OPTIONAL, p + "Peer"),
            ("request", 4, _MSG, _OPTIONAL, p + "Request"),
        ],
    )
    _message(fd, "CheckRequest", [("attributes", 1, _MSG, _OPTIONAL, p + "AttributeContext")])
    _message(
        fd,
        "RpcStatus",
        [("code", 1, _INT32, _OPTIONAL, ""), ("message", 2, _STRING, _OPTIONAL, "")],
    )
    _message(fd, "HttpStatus", [("code", 1, _INT32, _OPTIONAL, "")])
    # google.protobuf.BoolValue (the deprecated `append` Envoy's ext_authz still reads).
    _message(fd, "BoolValue", [("value", 1, _BOOL, _OPTIONAL, "")])
    _message(
        fd,
        "HeaderValueOption",
        [
            ("header", 1, _MSG, _OPTIONAL, p + "HeaderValue"),
            ("append", 2, _MSG, _OPTIONAL, p + "BoolValue"),
            ("append_action", 3, _INT32, _OPTIONAL, ""),
            ("keep_empty_value", 4, _BOOL, _OPTIONAL, ""),
        ],
    )
    _message(
        fd,
        "DeniedHttpResponse",
        [
            ("status", 1, _MSG, _OPTIONAL, p + "HttpStatus"),
            ("headers", 2, _MSG, _REPEATED, p + "HeaderValueOption"),
            ("body", 3, _STRING, _OPTIONAL, ""),
        ],
    )
    _message(
        fd,
        "OkHttpResponse",
        [
            ("headers", 2, _MSG, _REPEATED, p + "HeaderValueOption"),
            ("headers_to_remove", 5, _STRING, _REPEATED, ""),
        ],
    )
    _message(
        fd,
        "CheckResponse",
        [
            ("status", 1, _MSG, _OPTIONAL, p + "RpcStatus"),
            ("denied_response", 2, _MSG, _OPTIONAL, p + "DeniedHttpResponse"),
            ("ok_response", 3, _MSG, _OPTIONAL, p + "OkHttpResponse"),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    names = ("CheckRequest", "CheckResponse", "HeaderValueOption")
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"envoy.service.auth.v3.{n}"))
        for n in names
    }


_CLASSES = _build()
CheckRequest: Any = _CLASSES["CheckRequest"]
CheckResponse: Any = _CLASSES["CheckResponse"]

SERVICE = "envoy.service.auth.v3.Authorization"
METHOD = f"/{SERVICE}/Check"
# google.rpc.Code
OK, INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, UNAVAILABLE = 0, 3, 7, 16, 14
# envoy.config.core.v3.HeaderValueOption.HeaderAppendAction
APPEND_IF_EXISTS_OR_ADD, OVERWRITE_IF_EXISTS_OR_ADD = 0, 2

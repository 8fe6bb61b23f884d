"""Envoy's gRPC ext_authz on `authz.grpcListen` (DESIGN §13): the same decisions as
`/envoy`, in `CheckRequest` / `CheckResponse` (`envoy_grpc.py`), served by grpcio's
asyncio server in the sidecar's own event loop.

Allow: `status.code = OK` with `ok_response.headers` (the route, the marker or the
identity, each overwriting the client's value; one `x-remote-group` per group,
appended). Deny: `PERMISSION_DENIED` (`UNAUTHENTICATED` for a 401) with
`denied_response` carrying the proxy's status, headers and Status body. A request that
cannot be read is a `denied_response` 400 with a Status body, never an allow; a failure
of the decider is a gRPC error, which Envoy answers with `status_on_error` (503).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
from google.protobuf.message import (  # type: ignore[import-untyped, unused-ignore]
    DecodeError,
)

from sidecar.core.status import StatusError
from sidecar.edge.authz import envoy_grpc as pb
from sidecar.edge.authz.decider import Decided, Decider
from sidecar.wire.status import response as status_response

log = logging.getLogger("sidecar.authz")

# A refusal's headers that reach the client.
_CLIENT_HEADERS = frozenset(
    {
        "content-type",
        "www-authenticate",
        "retry-after",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "allow",
        "x-request-id",
    }
)


def _option(name: str, value: str, append: bool = False) -> Any:
    action = pb.APPEND_IF_EXISTS_OR_ADD if append else pb.OVERWRITE_IF_EXISTS_OR_ADD
    return {
        "header": {"key": name, "value": value},
        "append": {"value": append},
        "append_action": action,
    }


def allow_response(decided: Decided) -> Any:
    assert decided.allowed is not None
    seen: set[str] = set()
    options = []
    for name, value in decided.allowed.headers:
        options.append(_option(name, value, append=name in seen))
        seen.add(name)
    return pb.CheckResponse(status={"code": pb.OK}, ok_response={"headers": options})


def deny_response(status: int, headers: list[tuple[str, str]], body: bytes) -> Any:
    code = pb.UNAUTHENTICATED if status == 401 else pb.PERMISSION_DENIED
    return pb.CheckResponse(
        status={"code": code},
        denied_response={
            "status": {"code": status},
            "headers": [_option(k.lower(), v) for k, v in headers],
            "body": body.decode("utf-8", "replace"),
        },
    )


def _refusal(decided: Decided) -> Any:
    refusal = decided.refusal
    assert refusal is not None
    body = refusal.body if isinstance(refusal.body, bytes) else b""
    kept = [(k, v) for k, v in refusal.headers.items() if k.lower() in _CLIENT_HEADERS]
    return deny_response(refusal.status, kept, body)


def _bad(message: str) -> Any:
    answer = status_response(StatusError(400, message))
    body = answer.body if isinstance(answer.body, bytes) else b""
    return deny_response(400, [("content-type", "application/json")], body)


def describe(raw: bytes) -> tuple[str, str, list[tuple[str, str]], str]:
    """(method, target, headers, client address) of a serialized CheckRequest; a
    StatusError 400 when it cannot be read."""
    try:
        request = pb.CheckRequest.FromString(raw)
    except DecodeError:
        raise StatusError(400, "the CheckRequest cannot be decoded") from None
    http = request.attributes.request.http
    method, target = http.method, http.path
    if not method or not target:
        raise StatusError(400, "the CheckRequest names no HTTP method and path")
    headers: list[tuple[str, str]] = []
    if http.header_map.headers:
        for h in http.header_map.headers:
            value = h.value or h.raw_value.decode("utf-8", "surrogateescape")
            headers.append((h.key, value))
    else:
        headers.extend(http.headers.items())
    headers = [(k, v) for k, v in headers if not k.startswith(":")]
    remote = request.attributes.source.address.socket_address.address or "unknown"
    return method, target, headers, remote


class GrpcRunner:
    """The gRPC listener's lifecycle (setup, cleanup), as `sidecar serve` runs it."""

    def __init__(self, decider: Decider, address: str, reuse_port: bool) -> None:
        self.decider = decider
        self.address = address
        self.reuse_port = reuse_port
        self.server: grpc.aio.Server | None = None

    async def check(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            method, target, headers, remote = describe(raw)
            decided = await self.decider.decide(method, target, headers, remote, joined=True)
        except StatusError as exc:
            return _bad(str(exc))
        except Exception:
            log.exception("gRPC ext_authz: internal error")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the decider failed")
        if decided.allowed is not None:
            return allow_response(decided)
        return _refusal(decided)

    async def setup(self) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            self.check,
            request_deserializer=None,
            response_serializer=lambda message: message.SerializeToString(),
        )
        generic = grpc.method_handlers_generic_handler(pb.SERVICE, {"Check": handler})
        options = [("grpc.so_reuseport", 1 if self.reuse_port else 0)]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((generic,))
        if server.add_insecure_port(self.address) == 0:
            raise OSError(f"cannot listen on {self.address}")
        await server.start()
        self.server = server

    async def cleanup(self) -> None:
        if self.server is not None:
            await self.server.stop(0.2)
            self.server = None

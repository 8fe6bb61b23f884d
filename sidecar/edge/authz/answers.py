"""Encoding the decider's answers for the listener (`fastserver.encode`)."""

from __future__ import annotations

from aiohttp import web

from sidecar.core.status import StatusError
from sidecar.edge.authz.fastserver import encode
from sidecar.wire.status import response as status_response


def response_bytes(response: web.Response) -> bytes:
    body = response.body if isinstance(response.body, bytes) else b""
    return encode(response.status, list(response.headers.items()), body)


def error_bytes(exc: StatusError) -> bytes:
    return response_bytes(status_response(exc))

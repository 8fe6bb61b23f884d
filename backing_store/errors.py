"""Kubernetes `Status` bodies for every error the backing store answers.

The store is a separate service and imports nothing from the sidecar; the sidecar has
its own copy of these rules (`sidecar/core/status.py`). A contract test
(tests/system/test_architecture.py) checks that both give byte-for-byte the same bodies, so
that a tenant the sidecar conceals gets exactly the 404 of a tenant the store does
not know.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class StatusError(Exception):
    """An error answered with a Kubernetes Status body."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = dict(details) if details else None
        self.headers = dict(headers) if headers else {}

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.message, self.reason, self.details)

    def response(self) -> web.Response:
        return web.Response(
            status=self.code,
            body=json.dumps(self.body()).encode(),
            content_type="application/json",
            headers=self.headers,
        )


def status_body(
    code: int, message: str, reason: str | None = None, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    return body


def bad_request(message: str) -> StatusError:
    return StatusError(400, message)


def not_found(resource: str, name: str) -> StatusError:
    """Kubernetes' NotFound: `{resource} "{name}" not found`."""
    what = f'{resource} "{name}" not found' if name else f"{resource} not found"
    return StatusError(404, what, details={"name": name, "kind": resource})


def tenant_not_found(tenant: str) -> StatusError:
    """The 404 for a tenant that does not exist."""
    return not_found("tenants", tenant)

"""Kubernetes `Status` bodies for every error the sidecar answers itself (DESIGN §9).

Any stage raises `StatusError`; the outermost stage turns it into a response
(`sidecar.wire.status.response`: this module is data only, no aiohttp). The
backing store uses the same helpers so that a concealed tenant's 404 is byte-for-byte
the body a tenant that does not exist gets. `forbidden_message` is the one wording of
a policy refusal (the 403 body, `policy explain`, access reviews and the audit log).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.core.target import RequestTarget

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
    431: "RequestHeaderFieldsTooLarge",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
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

    def body_bytes(self) -> bytes:
        """The encoded Status body. A flood of refusals repeats a few bodies (the same
        429 for every request of a tenant over its limit), so the last BODY_CACHE
        distinct small ones are kept encoded. Messages can quote a URL's names, so a
        long one is encoded each time instead: the cache stays small (at most
        BODY_CACHE x CACHED_MESSAGE characters of keys) whatever clients send."""
        details = self.details
        if len(self.message) > CACHED_MESSAGE:
            return json.dumps(self.body()).encode()
        try:
            key = (self.code, self.message, self.reason, tuple(details.items()) if details else ())
            found = _bodies.get(key)
        except TypeError:  # an unhashable detail value
            return json.dumps(self.body()).encode()
        if found is None:
            if len(_bodies) >= BODY_CACHE:
                _bodies.clear()
            found = _bodies[key] = json.dumps(self.body()).encode()
        return found


BODY_CACHE = 1024
CACHED_MESSAGE = 256
_bodies: dict[tuple[Any, ...], bytes] = {}


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


def unauthorized(message: str) -> StatusError:
    return StatusError(401, message, headers={"WWW-Authenticate": 'Bearer realm="sidecar"'})


def body_too_large(limit: int) -> StatusError:
    """The 413 for a request body over `limits.maxBodyBytes`."""
    return StatusError(413, f"the request body is larger than the limit of {limit} bytes")


def forbidden(message: str) -> StatusError:
    return StatusError(403, message)


def not_found(resource: str, name: str) -> StatusError:
    """Kubernetes' NotFound: `{resource} "{name}" not found`."""
    what = f'{resource} "{name}" not found' if name else f"{resource} not found"
    return StatusError(404, what, details={"name": name, "kind": resource})


def tenant_not_found(tenant: str) -> StatusError:
    """The 404 for a tenant that does not exist, and for one the caller may not see."""
    return not_found("tenants", tenant)


def forbidden_message(user: str, tenant: str, target: RequestTarget) -> str:
    """Who may not do what, where: Kubernetes' wording, with the caller's tenant."""
    who = f'User "{user}" of tenant "{tenant}"'
    if not target.resource_request:
        return f'forbidden: {who} cannot {target.verb} path "{target.path}"'
    res = target.full_resource
    what = f'{res} "{target.name}"' if target.name else res
    where = ""
    if target.namespace:
        where = f' in the namespace "{target.namespace}" of tenant "{target.tenant}"'
    elif target.scope == "tenant":
        where = f' in tenant "{target.tenant}"'
    elif target.scope == "cluster":
        where = " at the cluster scope"
    return (
        f"{what} is forbidden: {who} cannot {target.verb} resource "
        f'"{res}" in API group "{target.api_group}"{where}'
    )

"""What every authenticator shares: the `Authenticator` interface, the names of the
authenticators, the rules for user, group and tenant names (`printable`, the rule for
every identity's names, lives beside `Identity` in `sidecar.pipeline.context`, where impersonation
uses it too), and the 401 for bad credentials."""

from __future__ import annotations

import re
from typing import Protocol

from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.core.identity import printable as printable
from sidecar.core.status import StatusError, unauthorized
from sidecar.core.target import is_dns1123_label

JWT = "jwt"
STATIC = "static-token"
TRUSTED = "trusted-headers"

# RFC 6750 b64token.
BEARER = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")


class Authenticator(Protocol):
    """Returns the caller, or None when the request carries nothing it recognises.
    Recognised but invalid credentials raise a 401 `StatusError` with the reason."""

    name: str

    def authenticate(self, request: web.Request, bearer: str | None) -> Identity | None: ...


class Authenticate(Protocol):
    """`sidecar.pipeline.identity.IdentityStage.authenticate`: the caller of a request, with
    the credentials in force (a 401 `StatusError` when it has none that are valid)."""

    def __call__(self, request: web.Request) -> Identity: ...


def reject(message: str) -> StatusError:
    """The 401 for credentials that were recognised but are not valid."""
    return unauthorized(message)


def tenant_name(value: object, source: str) -> str:
    """`value` as a tenant name (a DNS-1123 label), else a 401 naming `source`."""
    if not isinstance(value, str) or not value:
        raise reject(f"{source} has no tenant")
    if not is_dns1123_label(value):
        raise reject(f"the tenant {value[:70]!r} of {source} is not a DNS-1123 label")
    return value

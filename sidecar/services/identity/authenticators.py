"""The configured authenticators, built in their fixed order (JWT, static token,
trusted headers), and the one reading of the `Authorization` header."""

from __future__ import annotations

from aiohttp import web

from sidecar.config.settings import IdentityConfig
from sidecar.services.identity.headers import TrustedHeaderAuthenticator
from sidecar.services.identity.jwt import JwtAuthenticator
from sidecar.services.identity.keys import load_jwt_keys
from sidecar.services.identity.names import BEARER, Authenticator
from sidecar.services.identity.tokens import StaticTokenAuthenticator, load_token_file

_MAX_TOKEN = 16 * 1024


def build_authenticators(cfg: IdentityConfig) -> list[Authenticator]:
    """The configured authenticators in their fixed order; raises ConfigError."""
    found: list[Authenticator] = []
    keys = load_jwt_keys(cfg.jwt)
    if keys:
        found.append(JwtAuthenticator(cfg.jwt, keys))
    if cfg.token_file:
        found.append(StaticTokenAuthenticator(load_token_file(cfg.token_file)))
    if cfg.trusted_headers.enabled:
        found.append(TrustedHeaderAuthenticator(cfg.trusted_headers))
    return found


def parse_authorization(request: web.Request) -> tuple[str | None, str]:
    """(bearer token, problem): the token of a well-formed `Bearer` header, else the
    reason the Authorization header cannot be used ("" when there is none)."""
    values = request.headers.getall("Authorization", [])
    if not values:
        return None, ""
    if len(values) > 1:
        return None, "more than one Authorization header"
    scheme, _, rest = values[0].strip().partition(" ")
    if scheme.lower() != "bearer":
        return None, "the Authorization header is not a Bearer token"
    token = rest.strip()
    if not token:
        return None, "the Bearer token is empty"
    if len(token) > _MAX_TOKEN or not BEARER.match(token):
        return None, "the Bearer token is malformed"
    return token, ""

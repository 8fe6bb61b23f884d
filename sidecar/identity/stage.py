"""The identity stage: the request's credentials become `ctx.identity` (DESIGN §4).

The authenticators are tried in a fixed order (JWT, static token, trusted headers);
the first that recognises the request wins. The stage then computes what later stages
need to know about the caller, once (`settle`): the target with short paths resolved to
the caller's tenant, and the mode (enforce / dry-run) in force for that tenant. A
request with `Impersonate-*` headers keeps its short path unresolved: the impersonation
stage (`sidecar/identity/impersonation.py`, after the tenant rate limit) settles it for
whomever the request acts as. Incoming `X-Remote-*` headers of a request that did not
come through the trusted-header authenticator are dropped from the request, so no later
stage can read a spoofed value (the proxy also drops them and sets its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from sidecar.config import IdentityConfig
from sidecar.context import Identity, RequestContext
from sidecar.identity.headers import TrustedHeaderAuthenticator
from sidecar.identity.jwt import JwtAuthenticator
from sidecar.identity.keys import load_jwt_keys
from sidecar.identity.names import BEARER, TRUSTED, Authenticator, reject
from sidecar.identity.tokens import StaticTokenAuthenticator, load_token_file
from sidecar.pipeline import Handler
from sidecar.policy.decide import normalize
from sidecar.policy.impersonation import requested
from sidecar.policy.modes import mode_for

_MAX_TOKEN = 16 * 1024
_REMOTE_PREFIX = "x-remote-"

__all__ = ["IdentityStage", "build_authenticators", "parse_authorization", "settle"]


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


class IdentityStage:
    name = "identity"

    def __init__(self, authenticators: Sequence[Authenticator], global_mode: str) -> None:
        # Replaced as a whole by the credential watcher when a credential file changes.
        self.authenticators = tuple(authenticators)
        self.global_mode = global_mode

    def authenticate(self, request: web.Request) -> Identity:
        bearer, problem = parse_authorization(request)
        for authenticator in self.authenticators:
            identity = authenticator.authenticate(request, bearer)
            if identity is not None:
                return identity
        if problem:
            raise reject(problem)
        if bearer is not None:
            raise reject("the bearer token is not valid")
        raise reject("no credentials: send an Authorization: Bearer token")

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        identity = self.authenticate(ctx.request)
        ctx.audit["authenticator"] = identity.authenticator
        if identity.authenticator != TRUSTED:
            _strip_remote_headers(ctx)
        resolve = not requested(ctx.request.headers.keys())
        settle(ctx, identity, self.global_mode, resolve_target=resolve)
        return await call_next(ctx)


def settle(
    ctx: RequestContext, identity: Identity, global_mode: str, *, resolve_target: bool = True
) -> None:
    """`identity` becomes the request's: its short path resolved to that identity's
    tenant (unless `resolve_target` is off) and the mode in force for that tenant."""
    ctx.identity = identity
    if resolve_target and ctx.target is not None and ctx.target.resource_request:
        ctx.target = normalize(ctx.target, identity)
    ctx.mode = mode_for(global_mode, ctx.policy.tenant_modes, identity.tenant)


def _strip_remote_headers(ctx: RequestContext) -> None:
    request = ctx.request
    if not any(name.lower().startswith(_REMOTE_PREFIX) for name in request.headers):
        return
    kept = [(k, v) for k, v in request.headers.items() if not k.lower().startswith(_REMOTE_PREFIX)]
    ctx.audit["strippedRemoteHeaders"] = len(request.headers) - len(kept)
    try:
        ctx.request = request.clone(headers=kept)
    except (UnicodeEncodeError, RuntimeError):
        # Undecodable header bytes: keep the request; the proxy drops X-Remote-* anyway.
        pass

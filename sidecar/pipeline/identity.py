"""The identity stage: the request's credentials become `ctx.identity` (DESIGN §4).

The authenticators are tried in a fixed order (JWT, static token, trusted headers);
the first that recognises the request wins. The stage then computes what later stages
need to know about the caller, once (`settle`): the target with short paths resolved to
the caller's tenant, and the mode (enforce / dry-run) in force for that tenant. A
request with `Impersonate-*` headers keeps its short path unresolved: the impersonation
stage (`sidecar/pipeline/impersonation.py`, after the tenant rate limit) settles it for
whomever the request acts as. Incoming `X-Remote-*` headers of a request that did not
come through the trusted-header authenticator are dropped from the request, so no later
stage can read a spoofed value (the proxy also drops them and sets its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.policy.decide import normalize
from sidecar.policy.kinds.impersonation import requested
from sidecar.policy.kinds.modes import mode_for
from sidecar.services.identity.authenticators import parse_authorization
from sidecar.services.identity.names import TRUSTED, Authenticator, reject

_REMOTE_PREFIX = "x-remote-"

__all__ = ["IdentityStage", "settle"]


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

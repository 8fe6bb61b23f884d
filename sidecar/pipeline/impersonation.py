"""The impersonation stage (DESIGN §4): `Impersonate-*` headers decided, and the request
then acting as the impersonated identity.

It runs right after the tenant rate limit, so the CALLER's tenant pays for every
request it sends, impersonating or not, allowed or refused (docs/identity.md says why).
The headers are read and decided by `sidecar.policy.kinds.impersonation` (the one decision
function, per attribute); allowed, the impersonated identity becomes `ctx.identity`
(with the caller in `impersonated_by`), its tenant resolves the request's short path
and picks the mode, so authorization, quota, access reviews, the audit line and the
`X-Remote-*` headers sent upstream all see it. Refused: 403 naming the first refused
attribute; malformed: 400. The headers themselves never reach the upstream (the proxy
drops every `Impersonate-*` header).

Open watches are held to the same terms (`sidecar/edge/watches.py`): `acting_identity` is
who a watch's request acts as, which its credential check compares, and
`deciding_impersonation` decides the impersonation again whenever the policy changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.identity import settle
from sidecar.policy.kinds.impersonation import decide_impersonation, parse_impersonation, requested

if TYPE_CHECKING:
    from sidecar.core.target import RequestTarget
    from sidecar.pipeline.authorize import Authorize
    from sidecar.policy.decision import Verdict
    from sidecar.policy.engine import DecisionCache
    from sidecar.services.identity.names import Authenticate

__all__ = ["ImpersonationStage"]


class ImpersonationStage:
    name = "impersonation"

    def __init__(self, global_mode: str, cache: DecisionCache | None, *, conceal: bool) -> None:
        self.global_mode = global_mode
        self.cache = cache
        self.conceal = conceal

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        caller = ctx.identity
        if caller is None or not requested(ctx.request.headers.keys()):
            return await call_next(ctx)
        try:
            self._act_as(ctx, caller)
        except StatusError:
            # The audit line shows the request as the caller sent it.
            settle(ctx, caller, self.global_mode)
            raise
        return await call_next(ctx)

    def _act_as(self, ctx: RequestContext, caller: Identity) -> None:
        asked = parse_impersonation(ctx.request.headers.items())
        if asked is None:  # only `Impersonate-*` names Kubernetes does not read
            settle(ctx, caller, self.global_mode)
            return
        v = decide_impersonation(ctx.policy, caller, asked, conceal=self.conceal, cache=self.cache)
        record = asked.record()
        record["tenant"] = asked.tenant_for(caller)
        record["decision"] = "allowed" if v.allowed else "refused"
        record["reason"] = v.reason
        ctx.audit["impersonation"] = record
        if v.error is not None:
            raise v.error
        settle(ctx, asked.identity(caller), self.global_mode)

    # -- open watches -------------------------------------------------------------

    @staticmethod
    def acting_identity(authenticate: Authenticate) -> Authenticate:
        """`authenticate` (the caller, with the credentials in force), then whom the
        request acts as: what an open watch's identity is checked against."""

        def acting(request: web.Request) -> Identity:
            caller = authenticate(request)
            asked = parse_impersonation(request.headers.items())
            return caller if asked is None else asked.identity(caller)

        return acting

    def deciding_impersonation(self, authorize: Authorize) -> Authorize:
        """`authorize`, after deciding again (with the context's policy) that the caller
        may still act as the identity the request acts as; the 403 when not."""

        async def decided(
            ctx: RequestContext,
            identity: Identity,
            target: RequestTarget,
            *,
            read_body: bool = True,
            fetch_as: Identity | None = None,
        ) -> Verdict:
            caller = identity.impersonated_by
            if caller is not None:
                asked = parse_impersonation(ctx.request.headers.items())
                if asked is None or asked.identity(caller) != identity:
                    raise StatusError(403, "the request no longer impersonates this identity")
                v = decide_impersonation(
                    ctx.policy, caller, asked, conceal=self.conceal, cache=self.cache
                )
                if v.error is not None:
                    raise v.error
            return await authorize(ctx, identity, target, read_body=read_body, fetch_as=fetch_as)

        return decided

"""The audit line of a cached decision (DESIGN §9, §13), from pieces made once per
cache entry: the same line `sidecar.pipeline.audit.line_for` writes for it (a test
holds them equal), at a fraction of its cost. Everything that varies per request
(time, request id, method, target, status, latency, client, the rate limit's note) is
written per request; the identity, the target's reading and the decision are not."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget
from sidecar.pipeline.audit import _now_text, _text, line_for
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import CLIENT_CLOSED, RequestContext
from sidecar.policy.decision import Verdict
from sidecar.services.audit import ENCODER, MAX_RECORD_BYTES, AuditLog, cap, quote


class HitLine:
    """The fixed parts of a cached decision's audit line."""

    __slots__ = ("how", "notes", "what", "who")

    def __init__(
        self, identity: Identity, target: RequestTarget, decision: Verdict, notes: dict[str, Any]
    ) -> None:
        """`notes`: the audit notes a hit starts with (`authenticator`, `authz`,
        `decider`), in that order."""
        q = quote
        self.who = (
            f'"user":{q(identity.user)},"tenant":{q(identity.tenant)},'
            f'"groups":[{",".join(map(q, identity.groups))}]'
        )
        self.what = (
            f'"verb":{q(target.verb)},"apiGroup":{_text(target.api_group)},'
            f'"resource":{_text(target.full_resource)},"targetTenant":{_text(target.tenant)},'
            f'"namespace":{_text(target.namespace)},"name":{_text(target.name)}'
        )
        self.how = (
            f'"decision":{q(decision.outcome)},"reason":{_text(decision.reason)},'
            f'"revision":{_text(decision.revision)}'
        )
        self.notes = "".join(
            f",{q(k)}:{q(v) if type(v) is str else ENCODER.encode(v)}" for k, v in notes.items()
        )

    def line(self, ctx: RequestContext, status: int) -> str:
        elapsed = time.perf_counter() - ctx.started
        request = ctx.request
        q = quote
        extra = ctx.audit.get("ratelimit")
        notes = self.notes if extra is None else f'{self.notes},"ratelimit":{q(str(extra))}'
        line = (
            f'{{"time":"{_now_text()}","requestId":{q(ctx.request_id)},{self.who},'
            f'"method":{q(request.method)},"path":{q(request.raw_path)},{self.what},{self.how},'
            f'"status":{status},"latencyMs":{round(elapsed * 1000, 3)!r},'
            f'"client":{_text(request.remote)}{notes}}}\n'
        )
        return line if len(line) <= MAX_RECORD_BYTES else cap(line)


class HitAuditStage:
    """The audit stage of the hit chain: one line per request, as `AuditStage`."""

    name = "audit"

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        fixed: HitLine = ctx.parsed_body.audit_line  # the cache entry (decider.py)
        try:
            response = await call_next(ctx)
        except BaseException:
            self.audit.emit(line_for(ctx, CLIENT_CLOSED))
            raise
        self.audit.emit(fixed.line(ctx, response.status))
        return response

"""The audit stage: one audit line per request, built here from the request's context
(`line_for`) and written by the service (`sidecar.services.audit.AuditLog`)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import CLIENT_CLOSED, RequestContext
from sidecar.pipeline.ratelimit import ANONYMOUS_REFUSAL
from sidecar.services.audit import ENCODER, MAX_RECORD_BYTES, AuditLog, cap, quote


class AuditStage:
    """One audit record per request, with its final status (499 when the client went
    away), whoever answered it."""

    name = "audit"

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        try:
            response = await call_next(ctx)
        except asyncio.CancelledError:
            self.audit.emit(line_for(ctx, CLIENT_CLOSED))
            raise
        if ctx.audit.get("ratelimit") == ANONYMOUS_REFUSAL:
            status = response.status
            self.audit.refusals.add(ctx.request.remote or "unknown", lambda: line_for(ctx, status))
        else:
            self.audit.emit(line_for(ctx, response.status))
        return response


_clock_text: tuple[int, str] = (0, "")


def _now_text() -> str:
    """The current UTC second as text, formatted once per second (not per request)."""
    global _clock_text
    second = int(time.time())
    if second != _clock_text[0]:
        _clock_text = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
    return _clock_text[1]


def _text(value: str | None) -> str:
    return "null" if value is None else quote(value)


def line_for(ctx: RequestContext, status: int) -> str:
    """The audit line of a finished request (DESIGN §9): exactly what `encode` gives
    for the record `{"time", "requestId", "user", "tenant", "groups", "method", "path",
    "verb", "apiGroup", "resource", "targetTenant", "namespace", "name", "decision",
    "reason", "revision", "status", "latencyMs", "client"}` (with `"impersonatedBy":
    {"user", "tenant"}` after `groups` for an impersonated identity) followed by the
    stages' notes (`ctx.audit`), written out field by field: about a third of the cost of
    building that dict and encoding it, on every request."""
    elapsed = time.perf_counter() - ctx.started
    target, identity, decision, error = ctx.target, ctx.identity, ctx.decision, ctx.error
    request = ctx.request
    q = quote
    if identity is not None:
        who = (
            f'"user":{q(identity.user)},"tenant":{q(identity.tenant)},'
            f'"groups":[{",".join(map(q, identity.groups))}]'
        )
        caller = identity.impersonated_by
        if caller is not None:  # who sent the request (DESIGN §4)
            who += f',"impersonatedBy":{{"user":{q(caller.user)},"tenant":{q(caller.tenant)}}}'
    else:
        who = '"user":null,"tenant":null,"groups":[]'
    if target is not None:
        what = (
            f'"verb":{q(target.verb)},"apiGroup":{_text(target.api_group)},'
            f'"resource":{_text(target.full_resource)},"targetTenant":{_text(target.tenant)},'
            f'"namespace":{_text(target.namespace)},"name":{_text(target.name)}'
        )
    else:
        what = (
            f'"verb":{q(request.method.lower())},"apiGroup":null,"resource":null,'
            '"targetTenant":null,"namespace":null,"name":null'
        )
    if decision is not None:
        how = (
            f'"decision":{q(decision.outcome)},"reason":{_text(decision.reason)},'
            f'"revision":{_text(decision.revision)}'
        )
    else:
        reason = _text(error.message) if error is not None else "null"
        how = f'"decision":"none","reason":{reason},"revision":{_text(ctx.policy.revision)}'
    notes = ""
    if ctx.audit:
        try:
            notes = "".join(
                f",{q(k)}:{q(v) if type(v) is str else ENCODER.encode(v)}"
                for k, v in ctx.audit.items()
            )
        except (TypeError, ValueError) as exc:
            notes = f',"auditError":{q(f"notes not serializable: {exc}")}'
    line = (
        f'{{"time":"{_now_text()}","requestId":{q(ctx.request_id)},{who},'
        f'"method":{q(request.method)},"path":{q(request.raw_path)},{what},{how},'
        f'"status":{status},"latencyMs":{round(elapsed * 1000, 3)!r},'
        f'"client":{_text(request.remote)}{notes}}}\n'
    )
    return line if len(line) <= MAX_RECORD_BYTES else cap(line)

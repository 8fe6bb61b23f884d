"""The outermost stage: request id, error bodies, metrics and the audit line.

Every response passes here, so this is where a `StatusError` from any stage becomes a
Kubernetes Status response, where an unexpected exception becomes a logged 500, and
where each request is counted and audited exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
import uuid
from typing import Any

from aiohttp import web

from sidecar.audit import AuditLog
from sidecar.context import RequestContext
from sidecar.errors import StatusError
from sidecar.metrics import Metrics
from sidecar.pipeline import Handler

log = logging.getLogger("sidecar")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
CLIENT_CLOSED = 499


# New request ids: a random per-process prefix and a counter (uuid4 per request costs
# a getrandom() call on the hot path). 32 hex characters, unique across processes.
_ID_PREFIX = uuid.uuid4().hex[:16]
_id_counter = itertools.count(1)


def request_id_for(request: web.Request) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one."""
    given = request.headers.get("X-Request-Id")
    if given and _REQUEST_ID.match(given):
        return given
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


class ObserveStage:
    name = "observe"

    def __init__(self, metrics: Metrics, audit: AuditLog) -> None:
        self.metrics = metrics
        self.audit = audit

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        metrics = self.metrics
        metrics.in_flight.inc()
        response: web.StreamResponse
        error: StatusError | None = None
        try:
            response = await call_next(ctx)
        except StatusError as exc:
            error = exc
            response = self._error_response(ctx, exc)
        except ConnectionResetError:
            ctx.status = CLIENT_CLOSED
            response = web.Response(status=CLIENT_CLOSED)
        except asyncio.CancelledError:
            ctx.status = CLIENT_CLOSED
            self._record(ctx, CLIENT_CLOSED, None)
            raise
        except Exception:
            log.exception("internal error on %s %s", ctx.request.method, ctx.request.raw_path)
            error = StatusError(500, "internal error in the sidecar")
            response = self._error_response(ctx, error)
        finally:
            metrics.in_flight.dec()
        status = ctx.status if ctx.status == CLIENT_CLOSED else response.status
        self._record(ctx, status, error)
        return response

    def _error_response(self, ctx: RequestContext, exc: StatusError) -> web.Response:
        response = exc.response()
        for name, value in ctx.response_headers.items():
            response.headers.setdefault(name, value)
        response.headers["X-Request-Id"] = ctx.request_id
        return response

    def _record(self, ctx: RequestContext, status: int, error: StatusError | None) -> None:
        elapsed = time.perf_counter() - ctx.started
        target = ctx.target
        identity = ctx.identity
        decision = ctx.decision
        tenant = self.metrics.tenant(identity.tenant if identity else None)
        verb = target.verb if target else ctx.request.method.lower()
        outcome = decision.outcome if decision else "none"
        metrics = self.metrics
        metrics.child(metrics.requests, tenant, verb, outcome, str(status)).inc()
        metrics.child(metrics.latency, tenant).observe(elapsed)
        record: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "requestId": ctx.request_id,
            "user": identity.user if identity else None,
            "tenant": identity.tenant if identity else None,
            "groups": list(identity.groups) if identity else [],
            "method": ctx.request.method,
            "path": ctx.request.raw_path,
            "verb": verb,
            "apiGroup": target.api_group if target else None,
            "resource": target.full_resource if target else None,
            "targetTenant": target.tenant if target else None,
            "namespace": target.namespace if target else None,
            "name": target.name if target else None,
            "decision": outcome,
            "reason": decision.reason if decision else (error.message if error else None),
            "revision": decision.revision if decision else ctx.policy.revision,
            "status": status,
            "latencyMs": round(elapsed * 1000, 3),
            "client": ctx.request.remote,
        }
        if ctx.audit:
            record.update(ctx.audit)
        self.audit.emit(record)

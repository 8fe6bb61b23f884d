"""The errors stage: whatever a later stage raises becomes the client's answer.

A `StatusError` from any stage becomes its Kubernetes `Status` response (with the
headers stages added for the response, e.g. rate-limit headers), an unexpected
exception a logged 500 that names nothing internal, and a client that went away a 499.
The answered error is kept on the context (`ctx.error`) for the audit line.

`answer(ctx, exc)` is the same answer for a stage that returns it instead of raising:
the rate limit does, since a flood of refusals is its common case and an exception
unwinding through the stages costs a good part of a refusal.
"""

from __future__ import annotations

import logging

from aiohttp import web

from sidecar.core.status import StatusError
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import CLIENT_CLOSED, RequestContext
from sidecar.pipeline.kubectl_hints import with_kubectl_hint
from sidecar.wire.status import response as status_response

log = logging.getLogger("sidecar")


def error_response(ctx: RequestContext, exc: StatusError) -> web.Response:
    """The Status response of an error, with the request's response headers."""
    response = status_response(exc)
    for name, value in ctx.response_headers.items():
        response.headers.setdefault(name, value)
    response.headers["X-Request-Id"] = ctx.request_id
    return response


def answer(ctx: RequestContext, exc: StatusError) -> web.Response:
    """The response of a refusal, recorded as the request's error (for the audit)."""
    ctx.error = exc
    return error_response(ctx, exc)


class ErrorStage:
    name = "errors"

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        response: web.StreamResponse
        try:
            response = await call_next(ctx)
        except StatusError as exc:
            if exc.code == 415:  # what a kubectl user can do about it
                exc = with_kubectl_hint(exc, ctx.request.method, _shown_path(ctx))
            response = answer(ctx, exc)
        except ConnectionResetError:
            response = web.Response(status=CLIENT_CLOSED)
        except Exception:
            log.exception("internal error on %s %s", ctx.request.method, ctx.request.raw_path)
            ctx.error = StatusError(500, "internal error in the sidecar")
            response = error_response(ctx, ctx.error)
        ctx.status = response.status
        return response


def _shown_path(ctx: RequestContext) -> str:
    """The path a kubectl user would pass to `--raw`: the target as decided, with its
    tenant written out (kubectl sends a `--raw` path as it is, without the context's
    `/tenants/{t}` or a short path's tenant)."""
    target = ctx.target
    if target is not None and target.upstream_path and target.tenant is not None:
        return target.upstream_path
    return target.path if target is not None and target.path else ctx.request.path

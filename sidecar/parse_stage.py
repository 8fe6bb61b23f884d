"""The parse stage: header-size check, then URL → `ctx.target` (DESIGN §3)."""

from __future__ import annotations

from aiohttp import web

from sidecar.context import RequestContext
from sidecar.errors import StatusError
from sidecar.pipeline import Handler
from sidecar.target import TargetError, parse_target


class ParseStage:
    name = "parse"

    def __init__(self, max_header_bytes: int) -> None:
        self.max_header_bytes = max_header_bytes

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        request = ctx.request
        size = 0
        for name, value in request.raw_headers:
            size += len(name) + len(value) + 4
        if size > self.max_header_bytes:
            raise StatusError(
                431, f"the request headers are larger than {self.max_header_bytes} bytes"
            )
        raw = request.raw_path
        path, _, query = raw.partition("?")
        try:
            ctx.target = parse_target(request.method, path, query)
        except TargetError as exc:
            raise StatusError(exc.code, exc.message) from None
        return await call_next(ctx)

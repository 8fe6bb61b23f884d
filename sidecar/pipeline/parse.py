"""The parse stage: header-size check, then URL → `ctx.target` (DESIGN §3).

`ctx.target` is the one reading of the request target: the decision reads it and the
proxy forwards the target rebuilt from it (`RequestTarget.upstream_target`), never the
client's bytes.

`parse_target` is a pure function of the method and the raw target, and its result is
immutable, so the last `CACHE_SIZE` distinct (method, target) pairs are remembered:
most traffic repeats a few URLs, and parsing is a good part of a cached read's cost.
A client sending ever-new URLs only empties the cache now and then (never grows it)."""

from __future__ import annotations

from aiohttp import web

from sidecar.core.status import StatusError
from sidecar.core.target import RequestTarget, TargetError, parse_target
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.tenant_context import contextual

CACHE_SIZE = 4096
# Only targets up to this length are remembered, so the cache holds at most about
# CACHE_SIZE x 4 x MAX_CACHED bytes (raw, decoded and re-encoded forms) whatever
# clients send: a long target is parsed every time, which is what it is worth.
MAX_CACHED = 512


class ParseStage:
    name = "parse"

    def __init__(self, max_header_bytes: int) -> None:
        self.max_header_bytes = max_header_bytes
        self._parsed: dict[tuple[str, str], RequestTarget | TargetError] = {}

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        request = ctx.request
        size = 0
        for name, value in request.raw_headers:
            size += len(name) + len(value) + 4
        if size > self.max_header_bytes:
            raise StatusError(
                431, f"the request headers are larger than {self.max_header_bytes} bytes"
            )
        key = (request.method, request.raw_path)
        parsed = self._parsed.get(key)
        if parsed is None:
            parsed = self._parse(*key)
        if isinstance(parsed, TargetError):
            raise StatusError(parsed.code, parsed.message)
        ctx.target = contextual(request, parsed)  # a `/tenants/{t}` context (DESIGN §3)
        return await call_next(ctx)

    def _parse(self, method: str, raw: str) -> RequestTarget | TargetError:
        parsed: RequestTarget | TargetError
        try:
            parsed = parse_target(method, raw)
        except TargetError as exc:
            parsed = exc
            parsed.__traceback__ = None  # kept: hold no frames
        if len(raw) > MAX_CACHED:
            return parsed
        if len(self._parsed) >= CACHE_SIZE:
            self._parsed.clear()
        self._parsed[(method, raw)] = parsed
        return parsed

"""Forwarding to the upstream over the lean keep-alive pool (sidecar/upstream_pool.py),
bodies streamed.

Owns the upstream connection pool, header rewriting (hop-by-hop dropped, identity and
`X-Forwarded-*` set), timeouts, and the mapping of upstream failures to 502/504. Also
the small `get_json` call other stages use when the sidecar itself must read an object
(owner lookups, reconcile, tenant existence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from sidecar.config import Config
from sidecar.context import Identity, RequestContext, malformed_body
from sidecar.errors import StatusError
from sidecar.framing import send_continue
from sidecar.metrics import Metrics
from sidecar.upstream_pool import Body, Response, UpstreamBroken, UpstreamPool, UpstreamUnreachable
from sidecar.watches import WatchRelay

log = logging.getLogger("sidecar.proxy")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Set by the sidecar itself, never copied from the client. `Expect` is answered by the
# sidecar (sidecar/framing.py), the upstream never waits for a 100 of its own.
_REPLACED = frozenset(
    {
        "host",
        "content-length",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-request-id",
        "expect",
    }
)
# A `Connection` header naming one of these is 400 (DESIGN §8): dropping them would
# change the body's framing or meaning, or the caller's identity, on the way upstream.
_NOT_HOP_BY_HOP = frozenset(
    {
        "content-length",
        "content-encoding",
        "content-type",
        "transfer-encoding",
        "host",
        "authorization",
    }
)
# Identity headers: only the sidecar sets them. `_` counts as `-` (`X_Remote_User`),
# since some upstream servers read both spellings as the same header.
_IDENTITY_PREFIXES = ("x-remote-", "x_remote_", "x-remote_", "x_remote-")
# Upstream answers up to this size (with a Content-Length) are sent in one write.
SMALL_BODY = 64 * 1024
# A buffered (owner-filtered) upstream response larger than this is refused with 502.
MAX_FILTERED_RESPONSE = 256 * 1024 * 1024


class UpstreamError(StatusError):
    """A 502/503/504 caused by the upstream."""


class Upstream:
    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        limits = config.limits
        self.read_timeout = limits.upstream_read_timeout
        self.forward_authorization = config.identity.forward_authorization
        self._drop = HOP_BY_HOP | _REPLACED
        if not self.forward_authorization:
            self._drop = self._drop | {"authorization"}
        # Ordinary requests and the sidecar's own calls.
        self.pool = UpstreamPool(
            config.upstream, limits.upstream_pool_size, limits.upstream_connect_timeout
        )
        # Watches: a pool of their own, so they never take ordinary requests'
        # connections; a full one is a prompt 503 (sidecar/watches.py).
        self.watches = WatchRelay(limits.upstream_watch_pool_size)
        self.watch_pool = UpstreamPool(
            config.upstream, self.watches.pool_size, limits.upstream_connect_timeout
        )

    def close_watches(self) -> None:
        """End every open watch at once (SIGTERM; clients re-watch)."""
        self.watches.close_all()

    async def close(self) -> None:
        self.watches.close_all()
        await self.pool.close()
        await self.watch_pool.close()

    # -- forwarding ---------------------------------------------------------------

    async def forward(self, ctx: RequestContext) -> web.StreamResponse:
        """Forward one request; a watch through the watch relay (its own pool, ended
        within a second of its client going away)."""
        if ctx.target is not None and ctx.target.verb == "watch":
            return await self.watches.run(ctx, self._forward)
        return await self._forward(ctx)

    async def _forward(self, ctx: RequestContext) -> web.StreamResponse:
        request = ctx.request
        target = _target(request.raw_path, ctx.upstream_query)
        # An answer a stage must read (filtered lists, recorded creates) is read whole.
        whole = ctx.response_filter is not None or ctx.read_whole_answer
        headers = self.upstream_headers(ctx, identity_encoding=whole)
        body_state = _BodyState()
        body: Body = None
        length: int | None = None
        if ctx.body is not None:
            body = ctx.body
        elif request.body_exists:
            length = request.content_length
            limit = ctx.max_body_bytes
            if length is not None and length > limit:
                raise StatusError(413, f"the request body is larger than {limit} bytes")
            body = _stream_body(request, limit, body_state)
        watching = ctx.target is not None and ctx.target.verb == "watch"
        # A small fixed-length answer is read whole under the same timeout as the headers
        # and sent in one write; anything else streams.
        small_ok = not watching and not whole and request.method != "HEAD"
        pool = self.watch_pool if watching else self.pool
        answer: bytes | None = None
        try:
            # The pool's deadline covers the request and a small answer's body
            # (sidecar/upstream_pool.py: cheaper than a timer per request).
            upstream = await pool.request(
                request.method,
                target,
                headers,
                body,
                length,
                within=None if watching else self.read_timeout,
            )
            size = upstream.content_length
            if small_ok and size is not None and size <= SMALL_BODY:
                try:
                    answer = await upstream.read()
                except UpstreamBroken as exc:
                    upstream.close()
                    self.metrics.upstream_errors.labels("reset").inc()
                    raise UpstreamError(
                        502, f"the upstream failed mid-answer: {_describe(exc)}"
                    ) from None
                except BaseException:
                    upstream.close()
                    raise
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except ValueError as exc:
            if body_state.too_large:
                raise StatusError(
                    413, f"the request body is larger than {ctx.max_body_bytes} bytes"
                ) from None
            raise StatusError(400, f"a header cannot be forwarded: {exc}") from None
        except web.RequestPayloadError:
            raise malformed_body() from None
        except (UpstreamUnreachable, UpstreamBroken, OSError) as exc:
            if body_state.client_gone:
                raise ConnectionResetError("client went away while sending its body") from None
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(502, f"the upstream is unreachable: {_describe(exc)}") from None
        ctx.status = upstream.status
        if answer is not None:
            upstream.release()
            return _whole_response(ctx, upstream, answer)
        upstream.disarm()  # the reads below are timed on their own
        try:
            if whole:
                return await self._filtered(ctx, upstream)
            return await self._stream_back(ctx, upstream, watching)
        finally:
            upstream.release()

    async def _stream_back(
        self, ctx: RequestContext, upstream: Response, watching: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        _copy_response_headers(upstream, response)
        response.headers.update(ctx.response_headers)
        response.headers["X-Request-Id"] = ctx.request_id
        # Watches and chunked bodies stream with no read timeout; fixed-length bodies
        # get the read timeout between chunks.
        idle = None if watching or upstream.content_length is None else self.read_timeout
        try:
            await response.prepare(ctx.request)
            async with asyncio.timeout(None) as deadline:
                loop = asyncio.get_running_loop()
                while True:
                    if idle is not None:
                        deadline.reschedule(loop.time() + idle)
                    chunk = await upstream.readany()
                    if not chunk:
                        break
                    await response.write(chunk)
            await response.write_eof()
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            upstream.close()
            _abort(ctx.request)
        except UpstreamBroken:
            self.metrics.upstream_errors.labels("reset").inc()
            upstream.close()
            _abort(ctx.request)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            upstream.close()
            raise
        return response

    async def _filtered(self, ctx: RequestContext, upstream: Response) -> web.StreamResponse:
        raw = await self._read_whole(upstream)
        if ctx.response_filter is not None:
            raw = ctx.response_filter(upstream.status, raw)
        return _whole_response(ctx, upstream, raw)

    async def _read_whole(self, upstream: Response) -> bytes:
        """An upstream answer the sidecar must read (DESIGN §8): every byte up to its
        end, under the read timeout. Cut short (fewer bytes than its Content-Length, a
        chunked body without its last chunk) or larger than MAX_FILTERED_RESPONSE:
        502, never a partial body. Callers release or close the response."""
        declared = upstream.content_length
        if declared is not None and declared > MAX_FILTERED_RESPONSE:
            upstream.close()
            raise UpstreamError(502, "the upstream response is too large for the sidecar to read")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.read_timeout):
                while chunk := await upstream.readany():
                    size += len(chunk)
                    if size > MAX_FILTERED_RESPONSE:
                        upstream.close()
                        raise UpstreamError(
                            502, "the upstream response is too large for the sidecar to read"
                        )
                    chunks.append(chunk)
        except TimeoutError:
            upstream.close()
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except UpstreamBroken as exc:
            upstream.close()
            self.metrics.upstream_errors.labels("reset").inc()
            raise UpstreamError(
                502, f"the upstream answer was cut short: {_describe(exc)}"
            ) from None
        if declared is not None and size != declared:  # a second line of defence
            upstream.close()
            self.metrics.upstream_errors.labels("reset").inc()
            raise UpstreamError(
                502, f"the upstream answer was cut short ({size} of {declared} bytes)"
            )
        return b"".join(chunks)

    def upstream_headers(
        self, ctx: RequestContext, identity_encoding: bool = False
    ) -> list[tuple[str, str]]:
        """The headers sent upstream; 400 when `Connection` names a header that is not
        hop-by-hop (DESIGN §8). `identity_encoding`: ask for an uncompressed answer
        (one the sidecar must read)."""
        request = ctx.request
        given = request.headers
        drop = self._drop
        connection = given.getall("Connection", ())
        if connection:
            named = {token.strip().lower() for value in connection for token in value.split(",")}
            forbidden = sorted(named & _NOT_HOP_BY_HOP)
            if forbidden:
                raise StatusError(400, f"the Connection header may not name {', '.join(forbidden)}")
            drop = drop | named
        if identity_encoding:
            drop = drop | {"accept-encoding"}
        headers = [
            (name, value)
            for name, value in given.items()
            if (lower := name.lower()) not in drop and not lower.startswith(_IDENTITY_PREFIXES)
        ]
        identity = ctx.identity
        if identity is not None:
            headers.append(("X-Remote-User", identity.user))
            headers.append(("X-Remote-Tenant", identity.tenant))
            headers += [("X-Remote-Group", group) for group in identity.groups]
        peer = request.remote or ""
        previous = given.get("X-Forwarded-For")
        headers.append(("X-Forwarded-For", f"{previous}, {peer}" if previous else peer))
        headers.append(("X-Forwarded-Proto", request.scheme))
        headers.append(("X-Forwarded-Host", request.host))
        headers.append(("X-Request-Id", ctx.request_id))
        if identity_encoding:
            headers.append(("Accept-Encoding", "identity"))
        return headers

    # -- the sidecar's own calls ---------------------------------------------------

    async def get_json(
        self,
        path: str,
        identity: Identity | None = None,
        query: list[tuple[str, str]] | None = None,
        request_id: str = "",
    ) -> tuple[int, Any]:
        """GET `path` (already percent-encoded) as `identity`; returns (status, JSON).

        Upstream failures raise UpstreamError: 503 when unreachable (a decision that
        needs this read cannot be made), 504 on timeout, 502 for an answer cut short
        or too large."""
        headers: dict[str, str] = {"Accept": "application/json"}
        if identity is not None:
            headers["X-Remote-User"] = identity.user
            headers["X-Remote-Tenant"] = identity.tenant
        if request_id:
            headers["X-Request-Id"] = request_id
        try:
            async with asyncio.timeout(self.read_timeout):
                resp = await self.pool.request("GET", _target(path, query or []), headers.items())
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except (UpstreamUnreachable, UpstreamBroken, OSError) as exc:
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(503, f"the upstream is unreachable: {_describe(exc)}") from None
        except ValueError as exc:
            raise UpstreamError(400, f"a header cannot be sent upstream: {exc}") from None
        try:
            raw = await self._read_whole(resp)
            status = resp.status
        finally:
            resp.release()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            raise UpstreamError(502, "the upstream answered with invalid JSON") from None

    async def ping(self) -> tuple[bool, str]:
        """Readiness: the upstream answers HTTP at all (any status)."""
        try:
            async with asyncio.timeout(self.config.limits.upstream_connect_timeout):
                resp = await self.pool.request("GET", "/healthz", ())
                try:
                    await resp.read()
                finally:
                    resp.release()
                return True, f"upstream answered {resp.status}"
        except (TimeoutError, UpstreamUnreachable, UpstreamBroken, OSError) as exc:
            return False, f"upstream unreachable: {_describe(exc)}"


class _BodyState:
    __slots__ = ("client_gone", "malformed", "too_large")

    def __init__(self) -> None:
        self.too_large = False
        self.client_gone = False
        self.malformed = False


async def _stream_body(request: web.Request, limit: int, state: _BodyState) -> AsyncIterator[bytes]:
    """The client's body bytes as received (never decompressed). Raising stops the
    upstream request, whose connection the pool then closes instead of reusing it."""
    size = 0
    await send_continue(request)
    try:
        while True:
            chunk = await request.content.readany()
            if not chunk:
                return
            size += len(chunk)
            if size > limit:
                state.too_large = True
                raise ValueError("request body too large")
            yield chunk
    except web.RequestPayloadError:
        state.malformed = True
        raise
    except (ConnectionResetError, aiohttp.ClientConnectionResetError, asyncio.CancelledError):
        state.client_gone = True
        raise


def _target(raw_path: str, extra_query: list[tuple[str, str]]) -> str:
    """The request target sent upstream: the client's, byte for byte, plus the
    sidecar's own query parameters (owner filters)."""
    if extra_query:
        extra = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in extra_query)
        raw_path += ("&" if "?" in raw_path else "?") + extra
    return raw_path


def _copy_response_headers(upstream: Response, response: web.StreamResponse) -> None:
    drop = HOP_BY_HOP
    connection = upstream.headers.get("Connection")
    if connection:
        drop = drop | {h.strip().lower() for h in connection.split(",")}
    for name, value in upstream.headers.items():
        if name.lower() not in drop:
            response.headers.add(name, value)


def _whole_response(ctx: RequestContext, upstream: Response, body: bytes) -> web.Response:
    """A response sent in one write, with the upstream's headers and the sidecar's."""
    response = web.Response(status=upstream.status, reason=upstream.reason, body=body)
    _copy_response_headers(upstream, response)
    response.headers.popall("Content-Length", None)
    response.headers.update(ctx.response_headers)
    response.headers["X-Request-Id"] = ctx.request_id
    return response


def _abort(request: web.Request) -> None:
    """The response has started and cannot become an error: cut the connection."""
    transport = request.transport
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.abort()


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]

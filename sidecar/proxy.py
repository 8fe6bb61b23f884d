"""Forwarding to the upstream: one pooled aiohttp ClientSession, bodies streamed.

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
from multidict import CIMultiDict
from yarl import URL

from sidecar.config import Config
from sidecar.context import Identity, RequestContext
from sidecar.errors import StatusError
from sidecar.metrics import Metrics

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
# Set by the sidecar itself, never copied from the client.
_REPLACED = frozenset({"host", "content-length", "x-forwarded-for", "x-forwarded-proto",
                       "x-forwarded-host", "x-request-id"})
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
        target = config.upstream
        self.socket_path: str | None = None
        if target.startswith("unix:"):
            self.socket_path = target[len("unix:") :]
            self.base = "http://localhost"
        else:
            self.base = target.rstrip("/")
        limits = config.limits
        self.read_timeout = limits.upstream_read_timeout
        self.timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=limits.upstream_connect_timeout, sock_read=None
        )
        self.forward_authorization = config.identity.forward_authorization
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector: aiohttp.BaseConnector
            pool = self.config.limits.upstream_pool_size
            if self.socket_path:
                connector = aiohttp.UnixConnector(path=self.socket_path, limit=pool)
            else:
                connector = aiohttp.TCPConnector(limit=pool, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- forwarding ---------------------------------------------------------------

    async def forward(self, ctx: RequestContext) -> web.StreamResponse:
        request = ctx.request
        url = self._url(request.raw_path, ctx.upstream_query)
        headers = self.upstream_headers(ctx)
        body_state = _BodyState()
        data: Any = None
        if ctx.body is not None:
            data = ctx.body
        elif request.body_exists:
            length = request.content_length
            limit = ctx.max_body_bytes
            if length is not None:
                if length > limit:
                    raise StatusError(413, f"the request body is larger than {limit} bytes")
                headers["Content-Length"] = str(length)
            data = _stream_body(request, limit, body_state)
        if ctx.response_filter is not None:
            headers["Accept-Encoding"] = "identity"
        watching = ctx.target is not None and ctx.target.verb == "watch"
        # A small fixed-length answer is read whole under the same timeout as the headers
        # and sent in one write; anything else streams.
        small_ok = not watching and ctx.response_filter is None and request.method != "HEAD"
        body: bytes | None = None
        try:
            async with asyncio.timeout(None if watching else self.read_timeout):
                upstream = await self.session.request(
                    request.method, url, headers=headers, data=data, allow_redirects=False
                )
                length = upstream.content_length
                if small_ok and length is not None and length <= SMALL_BODY:
                    try:
                        body = await upstream.read()
                    except aiohttp.ClientError as exc:
                        upstream.release()
                        self.metrics.upstream_errors.labels("reset").inc()
                        raise UpstreamError(
                            502, f"the upstream failed mid-answer: {_describe(exc)}"
                        ) from None
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            if body_state.too_large:
                raise StatusError(413, f"the request body is larger than {ctx.max_body_bytes} "
                                  "bytes") from None
            if body_state.client_gone:
                raise ConnectionResetError("client went away while sending its body") from None
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(502, f"the upstream is unreachable: {_describe(exc)}") from None
        ctx.status = upstream.status
        if body is not None:
            upstream.release()
            return _whole_response(ctx, upstream, body)
        try:
            if ctx.response_filter is not None:
                return await self._filtered(ctx, upstream)
            return await self._stream_back(ctx, upstream, watching)
        finally:
            upstream.release()

    async def _stream_back(
        self, ctx: RequestContext, upstream: aiohttp.ClientResponse, watching: bool
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
                    chunk = await upstream.content.readany()
                    if not chunk:
                        break
                    await response.write(chunk)
            await response.write_eof()
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            upstream.close()
            _abort(ctx.request)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError) as exc:
            if isinstance(exc, ConnectionResetError) and ctx.request.transport is None:
                upstream.close()
                raise
            self.metrics.upstream_errors.labels("reset").inc()
            upstream.close()
            _abort(ctx.request)
        except ConnectionResetError:
            upstream.close()
            raise
        return response

    async def _filtered(
        self, ctx: RequestContext, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        assert ctx.response_filter is not None
        try:
            async with asyncio.timeout(self.read_timeout):
                raw = await upstream.content.read(MAX_FILTERED_RESPONSE + 1)
        except TimeoutError:
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, f"the upstream failed: {_describe(exc)}") from None
        if len(raw) > MAX_FILTERED_RESPONSE:
            raise UpstreamError(502, "the upstream response is too large to filter")
        return _whole_response(ctx, upstream, ctx.response_filter(upstream.status, raw))

    def upstream_headers(self, ctx: RequestContext) -> CIMultiDict[str]:
        request = ctx.request
        drop = HOP_BY_HOP | _REPLACED
        connection = request.headers.get("Connection")
        if connection:
            drop = drop | {h.strip().lower() for h in connection.split(",")}
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in request.headers.items():
            lower = name.lower()
            if lower in drop or lower.startswith("x-remote-"):
                continue
            if lower == "authorization" and not self.forward_authorization:
                continue
            headers.add(name, value)
        identity = ctx.identity
        if identity is not None:
            headers["X-Remote-User"] = identity.user
            headers["X-Remote-Tenant"] = identity.tenant
            for group in identity.groups:
                headers.add("X-Remote-Group", group)
        peer = request.remote or ""
        previous = request.headers.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{previous}, {peer}" if previous else peer
        headers["X-Forwarded-Proto"] = request.scheme
        headers["X-Forwarded-Host"] = request.host
        headers["X-Request-Id"] = ctx.request_id
        return headers

    def _url(self, raw_path: str, extra_query: list[tuple[str, str]]) -> URL:
        if extra_query:
            extra = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in extra_query)
            raw_path += ("&" if "?" in raw_path else "?") + extra
        return URL(self.base + raw_path, encoded=True)

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
        needs this read cannot be made), 504 on timeout."""
        headers: dict[str, str] = {"Accept": "application/json"}
        if identity is not None:
            headers["X-Remote-User"] = identity.user
            headers["X-Remote-Tenant"] = identity.tenant
        if request_id:
            headers["X-Request-Id"] = request_id
        url = self._url(path, query or [])
        try:
            async with asyncio.timeout(self.read_timeout):
                async with self.session.get(url, headers=headers, allow_redirects=False) as resp:
                    raw = await resp.read()
                    status = resp.status
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(503, f"the upstream is unreachable: {_describe(exc)}") from None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            raise UpstreamError(502, "the upstream answered with invalid JSON") from None

    async def ping(self) -> tuple[bool, str]:
        """Readiness: the upstream answers HTTP at all (any status)."""
        try:
            async with asyncio.timeout(self.config.limits.upstream_connect_timeout):
                async with self.session.get(self._url("/healthz", [])) as resp:
                    await resp.read()
                    return True, f"upstream answered {resp.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return False, f"upstream unreachable: {_describe(exc)}"


class _BodyState:
    __slots__ = ("client_gone", "too_large")

    def __init__(self) -> None:
        self.too_large = False
        self.client_gone = False


async def _stream_body(
    request: web.Request, limit: int, state: _BodyState
) -> AsyncIterator[bytes]:
    size = 0
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
    except (ConnectionResetError, aiohttp.ClientConnectionResetError, asyncio.CancelledError):
        state.client_gone = True
        raise


def _copy_response_headers(upstream: aiohttp.ClientResponse, response: web.StreamResponse) -> None:
    drop = HOP_BY_HOP
    connection = upstream.headers.get("Connection")
    if connection:
        drop = drop | {h.strip().lower() for h in connection.split(",")}
    for name, value in upstream.headers.items():
        if name.lower() not in drop:
            response.headers.add(name, value)


def _whole_response(
    ctx: RequestContext, upstream: aiohttp.ClientResponse, body: bytes
) -> web.Response:
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

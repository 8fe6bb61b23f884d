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
from sidecar.context import Identity, RequestContext, malformed_body
from sidecar.errors import StatusError
from sidecar.framing import send_continue
from sidecar.metrics import Metrics
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
_IDENTITY_PREFIX = "x-remote-"
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
        # Watches: a pool of their own, so they never take ordinary requests'
        # connections; a full one is a prompt 503 (sidecar/watches.py).
        self.watches = WatchRelay(limits.upstream_watch_pool_size)
        self._watch_session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pool of ordinary requests and the sidecar's own calls."""
        if self._session is None:
            self._session = self._new_session(self.config.limits.upstream_pool_size, self.timeout)
        return self._session

    @property
    def watch_session(self) -> aiohttp.ClientSession:
        """The pool of watches (`limits.upstreamWatchPoolSize`)."""
        if self._watch_session is None:
            limits = self.config.limits
            # `connect` also bounds the wait for a pooled connection: never indefinite.
            timeout = aiohttp.ClientTimeout(
                total=None,
                connect=limits.upstream_connect_timeout,
                sock_connect=limits.upstream_connect_timeout,
                sock_read=None,
            )
            self._watch_session = self._new_session(self.watches.pool_size, timeout)
        return self._watch_session

    def _new_session(self, pool: int, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
        connector: aiohttp.BaseConnector
        if self.socket_path:
            connector = aiohttp.UnixConnector(path=self.socket_path, limit=pool)
        else:
            connector = aiohttp.TCPConnector(limit=pool, keepalive_timeout=30)
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )

    def close_watches(self) -> None:
        """End every open watch at once (SIGTERM; clients re-watch)."""
        self.watches.close_all()

    async def close(self) -> None:
        self.watches.close_all()
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None

    # -- forwarding ---------------------------------------------------------------

    async def forward(self, ctx: RequestContext) -> web.StreamResponse:
        """Forward one request; a watch through the watch relay (its own pool, ended
        within a second of its client going away)."""
        if ctx.target is not None and ctx.target.verb == "watch":
            return await self.watches.run(ctx, self._forward)
        return await self._forward(ctx)

    async def _forward(self, ctx: RequestContext) -> web.StreamResponse:
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
        # An answer a stage must read (filtered lists, recorded creates) is read whole.
        whole = ctx.response_filter is not None or ctx.read_whole_answer
        if whole:
            headers["Accept-Encoding"] = "identity"
        watching = ctx.target is not None and ctx.target.verb == "watch"
        # A small fixed-length answer is read whole under the same timeout as the headers
        # and sent in one write; anything else streams.
        small_ok = not watching and not whole and request.method != "HEAD"
        body: bytes | None = None
        try:
            async with asyncio.timeout(None if watching else self.read_timeout):
                session = self.watch_session if watching else self.session
                upstream = await session.request(
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
                raise StatusError(
                    413, f"the request body is larger than {ctx.max_body_bytes} bytes"
                ) from None
            if body_state.malformed:
                raise malformed_body() from None
            if body_state.client_gone:
                raise ConnectionResetError("client went away while sending its body") from None
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(502, f"the upstream is unreachable: {_describe(exc)}") from None
        ctx.status = upstream.status
        if body is not None:
            upstream.release()
            return _whole_response(ctx, upstream, body)
        try:
            if whole:
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
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
        ) as exc:
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
        raw = await self._read_whole(upstream)
        if ctx.response_filter is not None:
            raw = ctx.response_filter(upstream.status, raw)
        return _whole_response(ctx, upstream, raw)

    async def _read_whole(self, upstream: aiohttp.ClientResponse) -> bytes:
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
                while chunk := await upstream.content.readany():
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
        except (aiohttp.ClientError, OSError) as exc:
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

    def upstream_headers(self, ctx: RequestContext) -> CIMultiDict[str]:
        """The headers sent upstream; 400 when `Connection` names a header that is not
        hop-by-hop (DESIGN §8)."""
        request = ctx.request
        named = {
            token.strip().lower()
            for value in request.headers.getall("Connection", [])
            for token in value.split(",")
        }
        forbidden = sorted(named & _NOT_HOP_BY_HOP)
        if forbidden:
            raise StatusError(400, f"the Connection header may not name {', '.join(forbidden)}")
        drop = HOP_BY_HOP | _REPLACED | named
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in request.headers.items():
            lower = name.lower()
            if lower in drop or lower.replace("_", "-").startswith(_IDENTITY_PREFIX):
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
        needs this read cannot be made), 504 on timeout, 502 for an answer cut short
        or too large."""
        headers: dict[str, str] = {"Accept": "application/json"}
        if identity is not None:
            headers["X-Remote-User"] = identity.user
            headers["X-Remote-Tenant"] = identity.tenant
        if request_id:
            headers["X-Request-Id"] = request_id
        url = self._url(path, query or [])
        try:
            async with asyncio.timeout(self.read_timeout):
                resp = await self.session.get(url, headers=headers, allow_redirects=False)
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(503, f"the upstream is unreachable: {_describe(exc)}") from None
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
                async with self.session.get(self._url("/healthz", [])) as resp:
                    await resp.read()
                    return True, f"upstream answered {resp.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return False, f"upstream unreachable: {_describe(exc)}"


class _BodyState:
    __slots__ = ("client_gone", "malformed", "too_large")

    def __init__(self) -> None:
        self.too_large = False
        self.client_gone = False
        self.malformed = False


async def _stream_body(request: web.Request, limit: int, state: _BodyState) -> AsyncIterator[bytes]:
    """The client's body bytes as received (never decompressed). Raising stops the
    upstream request, whose connection aiohttp then closes instead of pooling it."""
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

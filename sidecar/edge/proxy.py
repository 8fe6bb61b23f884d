"""Forwarding to the upstream over the lean keep-alive pool (sidecar/upstream/pool.py),
bodies streamed.

Owns the upstream connection pool, header rewriting (hop-by-hop dropped, identity and
`X-Forwarded-*` set), timeouts, and the mapping of upstream failures to 502/504. Also
the small `get_json` call other stages use when the sidecar itself must read an object
(owner lookups, settling, tenant existence), and `get_items`, a list read as a stream
one item at a time (quota reconcile).

Every exchange runs inside the watch relay (sidecar/edge/watches.py), which lets it go
within a second of its client leaving and ends a watch when its terms end. Streamed
answers (DESIGN §6): a watch streams with no read timeout (its lifetime bounds it);
any other answer ends when the upstream sends nothing for `limits.upstreamReadTimeout`
(a 504 before its first byte went out, a cut connection after). An answer the
upstream streams as a watch (`stream=watch` in its Content-Type, or a body of watch
events) to a request decided as something else is cut with a 502 and logged: the
sidecar decided a list, the upstream opened a watch (defence in depth, §1). Reads from
the upstream are timed on the upstream's pace, writes to the client on the client's: a
client that reads nothing for `limits.clientWriteTimeout` is cut by the server's write
deadline (sidecar/edge/write_deadline.py), which ends the exchange as a client gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from sidecar.config.settings import Config
from sidecar.core.identity import Identity
from sidecar.core.redact import mask_credential
from sidecar.core.status import StatusError, body_too_large
from sidecar.edge.watches import Exchange, WatchRelay
from sidecar.pipeline.context import RequestContext, malformed_body
from sidecar.services.listfilter import BrokenList, FilterLane, ListStream
from sidecar.services.metrics import Metrics
from sidecar.services.watchfilter import BrokenWatch, owner_watch
from sidecar.upstream.client import DryRunAnswer, UpstreamError
from sidecar.upstream.pool import Body, Response, UpstreamBroken, UpstreamPool, UpstreamUnreachable
from sidecar.wire.framing import send_continue

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
# sidecar (sidecar/wire/framing.py), the upstream never waits for a 100 of its own.
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
# Never forwarded: the sidecar's identity headers as above, and every impersonation
# header in either spelling (decided by the impersonation stage, DESIGN §4).
# Nor the decision service's headers (its route and "already decided" marker, §13).
_NEVER_FORWARDED = (
    *_IDENTITY_PREFIXES,
    "impersonate-",
    "impersonate_",
    "x-sidecar-",
    "x_sidecar_",
)
# Upstream answers up to this size (with a Content-Length) are sent in one write.
SMALL_BODY = 64 * 1024
# An upstream answer the sidecar reads (buffered, or an owner-filtered list streamed)
# larger than this is refused: 502, or a cut connection once a streamed list started.
MAX_FILTERED_RESPONSE = 256 * 1024 * 1024
# Owner-filtered lists (DESIGN §8, §11): fed to their filter in pieces of this size (the
# longest the event loop is held by one: about 0.15-0.25 ms with ijson's C backend), and
# held until their filtered output passes LIST_HOLD (until then a failure is still a 502).
LIST_SLICE = 8 * 1024
LIST_HOLD = 1024 * 1024
# One list item (or the fields around the items) may be this large, or twice the
# largest request body (`limits.maxBodyBytes`), whichever is more.
MIN_LIST_PART = 4 * 1024 * 1024
# The first bytes of a watch stream: a Kubernetes watch event (`{"type":"ADDED","object":…`).
_WATCH_EVENT = re.compile(
    rb'\s*\{\s*"type"\s*:\s*"(?:ADDED|MODIFIED|DELETED|BOOKMARK|ERROR)"\s*,\s*"object"\s*:'
)


def looks_like_watch_events(first: bytes) -> bool:
    """Whether an answer's first bytes are a watch event (Kubernetes' watch framing)."""
    return _WATCH_EVENT.match(first) is not None


def streams_a_watch(upstream: Response) -> bool:
    """Whether the answer's Content-Type says it is a watch stream (`;stream=watch`)."""
    return "stream=watch" in upstream.headers.get("Content-Type", "").lower()


class Upstream:
    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        limits = config.limits
        self.read_timeout = limits.upstream_read_timeout
        self.max_list_part = max(MIN_LIST_PART, 2 * limits.max_body_bytes)
        # Owner-filtered lists take turns: one piece of filtering per turn of the event
        # loop, however many lists are streaming, tenants in turn, at most a third of
        # the loop's time (_owner_list, sidecar/services/listfilter.py).
        self._list_lane = FilterLane()
        self.forward_authorization = config.identity.forward_authorization
        self._drop = HOP_BY_HOP | _REPLACED
        if not self.forward_authorization:
            self._drop = self._drop | {"authorization"}
        # Ordinary requests and the sidecar's own calls.
        self.pool = UpstreamPool(
            config.upstream, limits.upstream_pool_size, limits.upstream_connect_timeout
        )
        # Every exchange is let go when its client leaves; watches also end when their
        # terms do, and use a pool of their own, so they never take ordinary requests'
        # connections; a full one is a prompt 503 (sidecar/edge/watches.py).
        self.watches = WatchRelay(limits.upstream_watch_pool_size, limits.max_watch_seconds)
        self.watch_pool = UpstreamPool(
            config.upstream, self.watches.pool_size, limits.upstream_connect_timeout
        )

    def close_watches(self) -> None:
        """End every open watch at once (SIGTERM; clients re-watch)."""
        self.watches.close_all()

    async def close(self) -> None:
        self.watches.close_all()
        await self.watches.close()
        await self.pool.close()
        await self.watch_pool.close()

    # -- forwarding ---------------------------------------------------------------

    async def forward(self, ctx: RequestContext) -> web.StreamResponse:
        """Forward one request, let go within a second of its client going away; a watch
        on its own pool, ended when its terms end (sidecar/edge/watches.py)."""
        return await self.watches.run(ctx, self._forward)

    async def _forward(self, ctx: RequestContext, exchange: Exchange) -> web.StreamResponse:
        request = ctx.request
        if ctx.target is None:  # every forwarding route runs the parse stage
            raise StatusError(400, "the request target was not parsed")
        # DESIGN §8: the decided target, rebuilt from its parse, never the client's bytes.
        target = ctx.target.upstream_target(ctx.upstream_query)
        # An answer a stage must read (recorded creates, completed documents) is read
        # whole; an owner-filtered list streams through its filter. Both uncompressed.
        whole = ctx.response_filter is not None or ctx.read_whole_answer
        filtered = ctx.owner_list is not None
        headers = self.upstream_headers(ctx, identity_encoding=whole or filtered)
        body_state = _NO_BODY_STREAMED
        body: Body = None
        length: int | None = None
        if ctx.body is not None:
            body = ctx.body
        elif request.body_exists:
            length = request.content_length
            limit = ctx.max_body_bytes
            if length is not None and length > limit:
                raise body_too_large(limit)
            body_state = _BodyState()
            body = _stream_body(request, limit, body_state)
        watching = ctx.target is not None and ctx.target.verb == "watch"
        # A small fixed-length answer is read whole under the same timeout as the headers
        # and sent in one write; anything else streams.
        small_ok = not watching and not whole and not filtered and request.method != "HEAD"
        pool = self.watch_pool if watching else self.pool
        answer: bytes | None = None
        try:
            # The pool's deadline covers the request and a small answer's body
            # (sidecar/upstream/pool.py: cheaper than a timer per request).
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
                raise body_too_large(ctx.max_body_bytes) from None
            raise StatusError(400, f"a header cannot be forwarded: {exc}") from None
        except web.RequestPayloadError:
            raise malformed_body() from None
        except (UpstreamUnreachable, UpstreamBroken, OSError) as exc:
            if body_state.client_gone:
                raise ConnectionResetError("client went away while sending its body") from None
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(502, f"the upstream is unreachable: {_describe(exc)}") from None
        ctx.status = upstream.status
        if not watching and streams_a_watch(upstream):
            upstream.close()
            raise self._watch_answer(ctx, "its Content-Type")
        if answer is not None:
            upstream.release()
            response = _whole_response(ctx, upstream, answer)
            if request.method == "GET":
                # A read's answer goes out now, not after the stages around the
                # forwarding unwind (the audit line, the metrics, the rate limit's
                # release): nothing after the forwarding changes a read's answer, and
                # its latency is what the client waits for (docs/performance.md).
                await response.prepare(request)
                await response.write_eof()
            return response
        upstream.disarm()  # the reads below are timed on their own
        try:
            if filtered and not watching:  # an owner-filtered watch: _stream_back
                return await self._owner_list(ctx, upstream, exchange)
            if whole:
                return await self._filtered(ctx, upstream)
            return await self._stream_back(ctx, upstream, watching, exchange)
        finally:
            if watching:
                # A watch's connection is never reused: whatever the upstream still
                # sends on it belongs to no later exchange.
                upstream.close()
            else:
                upstream.release()

    async def _stream_back(
        self, ctx: RequestContext, upstream: Response, watching: bool, exchange: Exchange
    ) -> web.StreamResponse:
        """Stream the answer back. A watch has no read timeout (its lifetime and terms
        end it, `exchange.ending`: its chunked answer then ends cleanly). Any other
        answer ends when the upstream sends nothing for the read timeout, and its first
        bytes are looked at before anything is sent: watch events are cut (502)."""
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        _copy_response_headers(upstream, response)
        response.headers.update(ctx.response_headers)
        response.headers["X-Request-Id"] = ctx.request_id
        idle = None if watching else self.read_timeout
        # An owner-only watch: only the events of the tenant's own objects go out.
        events = owner_watch(ctx, upstream.status, self.max_list_part) if watching else None
        if events is not None:
            response.headers.pop("Content-Length", None)  # filtered: its own length
        try:
            # Each read from the upstream has the idle deadline, checked by the pool's
            # ticker (no timer armed and cancelled per chunk); writes to the client
            # have the server's write deadline instead (sidecar/edge/write_deadline.py).
            chunk: bytes | None = None
            if idle is not None:
                upstream.rearm(idle)
                chunk = await upstream.readany()
                upstream.disarm()
                if chunk and looks_like_watch_events(chunk):
                    upstream.close()
                    raise self._watch_answer(ctx, "its body")
            await response.prepare(ctx.request)
            while True:
                if chunk is None:
                    if idle is not None:
                        upstream.rearm(idle)
                        chunk = await upstream.readany()
                        upstream.disarm()
                    else:
                        chunk = await upstream.readany()
                if not chunk:
                    if events is not None and (last := events.finish()):
                        await response.write(last)
                    break
                if events is not None:
                    chunk = events.feed(chunk)
                if chunk:
                    await response.write(chunk)
                chunk = None
            await response.write_eof()
        except BrokenWatch as exc:  # the watch ends; the client watches again
            log.warning("request %s: owner-filtered watch cut: %s", ctx.request_id, exc)
            upstream.close()
            _abort(ctx.request)
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            upstream.close()
            if not response.prepared:
                raise UpstreamError(504, "the upstream did not answer in time") from None
            _abort(ctx.request)
        except UpstreamBroken as exc:
            self.metrics.upstream_errors.labels("reset").inc()
            upstream.close()
            if not response.prepared:
                raise UpstreamError(
                    502, f"the upstream failed mid-answer: {_describe(exc)}"
                ) from None
            _abort(ctx.request)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            upstream.close()
            raise
        except asyncio.CancelledError:
            upstream.close()
            # A watch the sidecar ended (its terms ended): end the answer cleanly, so
            # the client sees the watch end and watches again.
            if not (response.prepared and exchange.ending and exchange.absorb()):
                raise
            ctx.audit["watch"] = f"ended: {exchange.ended}"
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                await response.write_eof()
        return response

    def _watch_answer(self, ctx: RequestContext, how: str) -> UpstreamError:
        """The 502 for an answer streamed as a watch (by `how`) to a request the sidecar
        decided as something else, and the log line saying so."""
        verb = ctx.target.verb if ctx.target is not None else ctx.request.method.lower()
        resource = ctx.target.resource if ctx.target is not None else ""
        log.warning(
            "request %s: the upstream answered a %s of %r with a watch stream (by %s); cut",
            ctx.request_id,
            verb,
            resource,
            how,
        )
        self.metrics.upstream_errors.labels("watch_answer").inc()
        return UpstreamError(
            502, f"the upstream answered this {verb} with a watch stream; the sidecar cut it"
        )

    async def _owner_list(
        self, ctx: RequestContext, upstream: Response, exchange: Exchange
    ) -> web.StreamResponse:
        """An owner-filtered list (DESIGN §5, §8), streamed through its filter
        (sidecar/services/listfilter.py) in pieces of `LIST_SLICE` bytes, one piece at a time
        across all lists (`_list_lane`), so no list holds the event loop for long and
        many lists together hold it no longer than one.

        The filtered answer is held until it passes `LIST_HOLD` bytes: an answer that
        ends before that is sent whole once it is known to be complete, and one cut
        short, invalid, or with a part larger than `max_list_part` is a 502 (504 when
        the upstream stalls). Past `LIST_HOLD` the answer streams (chunked), and such a
        failure cuts the connection: the client sees a broken answer (no last chunk),
        never a clean-looking partial list (docs/security.md). An answer that is not a
        2xx is no list: it streams back as it is. A HEAD answer has no body."""
        assert ctx.owner_list is not None
        if ctx.request.method == "HEAD":
            return _whole_response(ctx, upstream, b"")
        if not 200 <= upstream.status < 300:
            return await self._stream_back(ctx, upstream, False, exchange)
        flt = ctx.owner_list
        declared = upstream.content_length
        if declared is not None and declared > MAX_FILTERED_RESPONSE:
            upstream.close()
            self.metrics.upstream_errors.labels("too_large").inc()
            raise UpstreamError(502, "the upstream list is too large for the sidecar to filter")
        stream = ListStream(flt.item, flt.row, self.max_list_part)
        held: list[bytes] = []
        held_size = 0
        response: web.StreamResponse | None = None
        size = 0
        tenant = _tenant_of(ctx.identity)
        failure: tuple[int, str, str] | None = None
        try:
            while True:
                # Each read has the idle deadline (the pool's ticker checks it).
                upstream.rearm(self.read_timeout)
                chunk = await upstream.readany()
                # The client's pace is not the upstream's: writes to the client have
                # the server's write deadline (sidecar/edge/write_deadline.py).
                upstream.disarm()
                if not chunk:
                    break
                if size == 0 and looks_like_watch_events(chunk):
                    upstream.close()
                    raise self._watch_answer(ctx, "its body")
                size += len(chunk)
                if size > MAX_FILTERED_RESPONSE:
                    failure = (502, "too_large", "the upstream list is too large to filter")
                    break
                out = await self._through(stream, chunk, tenant)
                if not out:
                    continue
                if response is not None:
                    await response.write(out)
                    continue
                held.append(out)
                held_size += len(out)
                if held_size > LIST_HOLD:
                    response = await self._start_list(ctx, upstream, held)
                    held = []
            if failure is None and declared is not None and size != declared:
                failure = (502, "reset", f"the list was cut short ({size} of {declared} bytes)")
            if failure is None:
                async with self._list_lane.turn(tenant):
                    out = stream.finish()
        except TimeoutError:
            failure = (504, "timeout", "the upstream did not answer in time")
        except UpstreamBroken as exc:
            failure = (502, "reset", f"the list was cut short: {_describe(exc)}")
        except BrokenList as exc:
            failure = (502, "invalid", f"the list cannot be read: {exc}")
        except (ConnectionResetError, aiohttp.ClientConnectionResetError, asyncio.CancelledError):
            upstream.close()
            raise
        if failure is not None:
            status, kind, message = failure
            upstream.close()
            self.metrics.upstream_errors.labels(kind).inc()
            if response is None:
                raise UpstreamError(status, f"the upstream answer was refused: {message}")
            log.warning("request %s: owner-filtered list cut: %s", ctx.request_id, message)
            ctx.audit["list"] = f"cut: {message}"
            _abort(ctx.request)
            return response
        if response is None:
            return _whole_response(ctx, upstream, b"".join([*held, out]))
        if out:
            await response.write(out)
        await response.write_eof()
        return response

    async def _through(self, stream: ListStream, chunk: bytes, tenant: str) -> bytes:
        """`chunk` fed to a list's parser a `LIST_SLICE` at a time, taking turns on the
        event loop with every list being read (`_list_lane`, a `FilterLane`: owner-
        filtered lists and reconcile pages): one slice at a time, a turn of the loop
        between two, tenants in turn and at most a third of the loop's time, so many lists
        together hold the loop no longer than one slice at a time; what came out."""
        outs: list[bytes] = []
        lane = self._list_lane
        for start in range(0, len(chunk), LIST_SLICE):
            async with lane.turn(tenant):
                out = stream.feed(chunk[start : start + LIST_SLICE])
            if out:
                outs.append(out)
        return b"".join(outs)

    async def _start_list(
        self, ctx: RequestContext, upstream: Response, held: list[bytes]
    ) -> web.StreamResponse:
        """Start streaming an owner-filtered list: the headers, then what was held."""
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        _copy_response_headers(upstream, response)
        response.headers.popall("Content-Length", None)
        response.headers.update(ctx.response_headers)
        response.headers["X-Request-Id"] = ctx.request_id
        await response.prepare(ctx.request)
        await response.write(b"".join(held))
        return response

    async def _filtered(self, ctx: RequestContext, upstream: Response) -> web.StreamResponse:
        raw = await self._read_whole(upstream)
        if looks_like_watch_events(raw[:4096]):
            raise self._watch_answer(ctx, "its body")
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
        # The whole read has the read timeout, checked by the pool's ticker (no timer
        # per answer); released or closed by the caller, which disarms it.
        upstream.rearm(self.read_timeout)
        try:
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
        (one the sidecar must read). Every header the upstream may act on as identity
        is the sidecar's own or dropped (DESIGN §4): `X-Remote-*` and `Impersonate-*`
        (`_` for `-` too), and those named in `identity.stripHeaders`."""
        request = ctx.request
        given = request.headers
        drop = self._drop
        strip = self.config.identity.strip_header_names
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
            if (lower := name.lower()) not in drop
            and not lower.startswith(_NEVER_FORWARDED)
            and not (strip and lower.replace("_", "-") in strip)
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

    async def dry_run(self, ctx: RequestContext) -> DryRunAnswer:
        """Send this request as a dry run and read what the upstream says the object
        would become (DESIGN §7): the same method, path, query, body and Content-Type,
        the same identity headers as the real request would carry, with `dryRun=All`
        added (replacing any the client sent), asking for JSON. The body is read first
        (`ctx.read_body`: the limit, 413) and kept for the real request.

        Upstream failures raise UpstreamError: 502 unreachable or cut short, 504 on
        timeout; a 2xx whose body is not JSON is a 502."""
        if ctx.target is None:
            raise StatusError(400, "the request target was not parsed")
        body = await ctx.read_body()
        target = ctx.target.upstream_target([*ctx.upstream_query, ("dryRun", "All")])
        headers = [
            (name, value)
            for name, value in self.upstream_headers(ctx, identity_encoding=True)
            if name.lower() != "accept"
        ]
        headers.append(("Accept", "application/json"))
        try:
            resp = await self.pool.request(
                ctx.request.method, target, headers, body, within=self.read_timeout
            )
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer the dry run in time") from None
        except ValueError as exc:
            raise StatusError(400, f"a header cannot be forwarded: {exc}") from None
        except (UpstreamUnreachable, UpstreamBroken, OSError) as exc:
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(502, f"the upstream is unreachable: {_describe(exc)}") from None
        resp.disarm()  # _read_whole times its own reads
        try:
            raw = await self._read_whole(resp)
            status = resp.status
            ctype = resp.headers.get("Content-Type", "")
        finally:
            resp.release()
        obj: Any = None
        if 200 <= status < 300:
            try:
                obj = json.loads(raw) if raw else None
            except ValueError:
                raise UpstreamError(
                    502, "the upstream answered the dry run with invalid JSON"
                ) from None
        return DryRunAnswer(status, ctype, raw, obj)

    async def get_items(
        self,
        path: str,
        identity: Identity | None,
        query: list[tuple[str, str]],
        item: Callable[[Any], None],
    ) -> tuple[int, dict[str, Any]]:
        """GET a list (`path` already percent-encoded) as `identity`, streamed: each
        element of its `items` is handed to `item` as it is parsed, and kept nowhere.
        The answer goes through the owner-filtered lists' parser (`ListStream`, which
        drops every element once `item` has seen it) in pieces taking turns with them
        (`_through`), so whatever the list's size, memory holds one piece of it and one
        item, and the event loop is held for one piece at a time. Returns the status
        and, for a 2xx, the list's other top-level fields (`metadata`, with its
        `continue`); a non-2xx answer is not read ({}). A 2xx answer must be an object
        with an `items` array.

        Upstream failures raise UpstreamError: 503 when unreachable, 504 when it sends
        nothing for the read timeout, 502 for an answer cut short, not one JSON
        document, or with an item larger than the list part limit."""
        try:
            upstream = await self.pool.request(
                "GET",
                _target(path, query),
                self._own_headers(identity, "").items(),
                within=self.read_timeout,
            )
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except (UpstreamUnreachable, UpstreamBroken, OSError) as exc:
            self.metrics.upstream_errors.labels("refused").inc()
            raise UpstreamError(503, f"the upstream is unreachable: {_describe(exc)}") from None
        except ValueError as exc:
            raise UpstreamError(400, f"a header cannot be sent upstream: {exc}") from None
        if not 200 <= upstream.status < 300:
            upstream.close()
            return upstream.status, {}
        upstream.disarm()  # each read below is timed on its own
        stream = ListStream(item, _dropped, self.max_list_part)
        outs: list[bytes] = []
        size = 0
        tenant = _tenant_of(identity)
        try:
            while True:
                upstream.rearm(self.read_timeout)  # each read has the idle deadline
                chunk = await upstream.readany()
                upstream.disarm()
                if not chunk:
                    break
                size += len(chunk)
                outs.append(await self._through(stream, chunk, tenant))
            declared = upstream.content_length
            if declared is not None and size != declared:
                raise UpstreamBroken(f"{size} of {declared} bytes")
            async with self._list_lane.turn(tenant):
                outs.append(stream.finish())
            if "items" not in stream.arrays:
                raise BrokenList("the answer is not a list (no items array)")
            fields = json.loads(b"".join(outs))
        except TimeoutError:
            upstream.close()
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamError(504, "the upstream did not answer in time") from None
        except UpstreamBroken as exc:
            upstream.close()
            self.metrics.upstream_errors.labels("reset").inc()
            raise UpstreamError(502, f"the upstream list was cut short: {_describe(exc)}") from None
        except (BrokenList, ValueError) as exc:
            upstream.close()
            self.metrics.upstream_errors.labels("invalid").inc()
            raise UpstreamError(502, f"the upstream list cannot be read: {exc}") from None
        except BaseException:
            upstream.close()
            raise
        upstream.release()
        return upstream.status, fields if isinstance(fields, dict) else {}

    def _own_headers(self, identity: Identity | None, request_id: str) -> dict[str, str]:
        """The headers of the sidecar's own GETs: JSON asked for, as `identity`."""
        headers: dict[str, str] = {"Accept": "application/json"}
        if identity is not None:
            headers["X-Remote-User"] = identity.user
            headers["X-Remote-Tenant"] = identity.tenant
        if request_id:
            headers["X-Request-Id"] = request_id
        return headers

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
        headers = self._own_headers(identity, request_id)
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


# The state of a request whose body is not streamed (none, or read by a stage): never
# changed, so one for all.
_NO_BODY_STREAMED = _BodyState()


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


def _tenant_of(identity: Identity | None) -> str:
    """Whose turn a list's filtering takes (the caller's tenant, as the rate limit keys
    it)."""
    return "" if identity is None else identity.sender.tenant


def _dropped(_row: Any) -> None:
    """A list read for its items only: Table rows are not kept."""


def _target(raw_path: str, extra_query: list[tuple[str, str]]) -> str:
    """The target of one of the sidecar's own calls: `raw_path` (already encoded) plus
    its query parameters."""
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
    """A response sent in one write, with the upstream's headers and the sidecar's. An
    error answer that quotes the request's credential has it masked (DESIGN §9)."""
    authorization = ctx.request.headers.get("Authorization")
    if upstream.status >= 400 and authorization:
        body = mask_credential(body, authorization)
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

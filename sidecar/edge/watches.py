"""Forwarded exchanges and open watches: let go when the client leaves, end when their
terms do (DESIGN §5, §6, §9).

Every forwarded request runs through `WatchRelay.run`, watch or not:

- **The client goes away.** aiohttp tells a handler nothing when its client
  disconnects unless `handler_cancellation` is on. That switch stays off: it would
  cancel every handler at whatever await it is in, cutting quota commits, releases and
  audit records short after the upstream already acted. Instead the connection tells
  the relay when it ends (`sidecar serve`'s connections, `DeadlineHandler.on_lost`,
  set while an exchange is in flight: no task or timer per request), and one shared
  poller looks at the client connections of the exchanges in flight every
  `POLL_SECONDS` as the fallback (other servers; a connection closing but not ended).
  When a client is gone, its request's task is cancelled, and only while it is inside
  the forwarding (`run` registers it there and nowhere else): waiting for an upstream
  connection, sending the body, waiting for the answer's headers, or streaming the
  answer back. The cancellation closes the upstream connection (an unfinished answer
  is never pooled again) and `run` takes it back (`Task.uncancel`) and raises
  ConnectionResetError, so every stage around the forwarding unwinds as for any
  client that went away: the in-flight slot is freed, a quota reservation released,
  the audit line written (499).
- **The client stops reading.** Every answer, a watch's included, is bound by the
  server's write deadline (`limits.clientWriteTimeout`, sidecar/edge/write_deadline.py):
  a client that reads nothing of what waits for it for that long has its connection
  cut, and the poller then lets its exchange go as above. A watch with nothing to send
  is idle, not blocked, and keeps its own rules (below); one whose events pile up
  unread is cut like any other answer, and its client watches again.
- **Watches** use an upstream pool of their own (`limits.upstreamWatchPoolSize`), so
  however many watches are open, ordinary requests always find a connection; a full
  one answers the next watch 503 with `Retry-After` at once. (Each tenant's share is
  capped by `maxWatches` in the rate-limit stage.)
- **A watch ends when its terms do**: on every policy swap (`policy_changed`) each open
  watch is decided again with the new policy through the one decision function (same
  identity, same target), and one that would now be refused is ended; when the
  credential files are reloaded (`credentials_changed`) each watch's request is
  authenticated again, and one whose credential is gone (or now names someone else) is
  ended; a JWT watch ends when its token expires; and every watch ends after its own
  lifetime, drawn between 1 and 2 times of `limits.maxWatchSeconds` (as the Kubernetes API
  server does, so watches opened together do not all end together). Ending a watch
  closes its upstream connection and ends the chunked answer cleanly: the client sees
  the watch end and watches again, and gets the answer the new terms give. A watch
  ended before its answer started is answered with the refusal instead.
- `close_all()` ends every open watch at once, cleanly as above (SIGTERM: the clients
  see the end of the stream and re-watch elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError, unauthorized
from sidecar.edge.write_deadline import DeadlineHandler
from sidecar.pipeline.context import DRY_RUN, RequestContext
from sidecar.policy.kinds.modes import mode_for

if TYPE_CHECKING:
    from sidecar.pipeline.authorize import Authorize
    from sidecar.policy.decision import Verdict
    from sidecar.policy.source.bundle import PolicyBundle
    from sidecar.services.identity.names import Authenticate

log = logging.getLogger("sidecar.watches")

POLL_SECONDS = 0.25
DEFAULT_MAX_WATCH_SECONDS = 1800.0


def client_gone(request: web.BaseRequest) -> bool:
    """Whether the request's client connection is closed (or closing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def watch_lifetime(max_seconds: float, draw: Callable[[], float]) -> float:
    """One watch's own limit: uniformly between 1 and 2 times of `max_seconds`, with
    `draw()` uniform in [0, 1)."""
    return max_seconds * (1.0 + draw())


class Exchange:
    """One forwarded request while it is inside `WatchRelay.run`."""

    __slots__ = ("cancelled", "ended", "gone", "refusal", "request", "task")

    def __init__(self, request: web.BaseRequest, task: asyncio.Task[Any]) -> None:
        self.request = request
        self.task = task
        # The client went away (or SIGTERM cut it): the exchange ends as a 499.
        self.gone = False
        # Why the sidecar ended this watch ("" while it runs), and what to answer when
        # nothing of the answer was sent yet.
        self.ended = ""
        self.refusal: StatusError | None = None
        # A cancellation of ours is on its way to the task.
        self.cancelled = False

    def absorb(self) -> bool:
        """A cancellation arrived: take ours back. True when it was ours and nothing
        else asked to cancel the task (it may carry on); False: let it propagate."""
        if not self.cancelled:
            return False
        self.cancelled = False
        return self.task.uncancel() == 0

    def lost(self) -> None:
        """Its client's connection ended (the connection's own callback): the exchange
        ends as a 499, now."""
        if self.gone or self.task.done():
            return
        self.gone = True
        if not self.cancelled:
            self.cancelled = True
            self.task.cancel()

    @property
    def ending(self) -> bool:
        """Ended by the sidecar, its client still there: end the answer cleanly."""
        return bool(self.ended) and not self.gone


@dataclasses.dataclass(eq=False, slots=True)
class OpenWatch:
    """An open watch and what its right to go on depends on."""

    exchange: Exchange
    ctx: RequestContext
    # Its own lifetime in seconds (drawn between 1 and 2 times of maxWatchSeconds).
    lifetime: float
    # Loop time it ends at: the end of its lifetime or of its credential, which first.
    deadline: float
    # Why it ends at `deadline`, and the refusal for an answer not started by then.
    deadline_reason: str
    deadline_refusal: StatusError
    # The policy it was last decided with.
    policy: PolicyBundle


class WatchTerms:
    """What an open watch's right to go on depends on: the decision (the policy in
    force, decided by the one decision function) and the credential it was opened with."""

    def __init__(
        self,
        authorize: Authorize,
        forwarded: Callable[[Verdict, bool], bool],
        authenticate: Authenticate,
        expires_at: Callable[[web.Request, Identity], float | None],
        current_policy: Callable[[], PolicyBundle],
        global_mode: str,
    ) -> None:
        self.authorize = authorize
        self.forwarded = forwarded
        self.authenticate = authenticate
        self.expires_at = expires_at
        self.current_policy = current_policy
        self.global_mode = global_mode

    async def policy_refusal(self, ctx: RequestContext, bundle: PolicyBundle) -> StatusError | None:
        """What the request of this watch would get from `bundle` if refused now (the
        decision as the authorize stage takes it, dry-run included); None while it would
        still be forwarded. A decision that cannot be made now (an owner that cannot be
        read) ends the watch too: the client re-watches and gets the answer."""
        identity, target = ctx.identity, ctx.target
        if identity is None or target is None:
            return None
        decided = dataclasses.replace(ctx, policy=bundle)
        try:
            verdict = await self.authorize(decided, identity, target, read_body=False)
        except StatusError as exc:
            return exc
        dry = mode_for(self.global_mode, bundle.tenant_modes, identity.tenant) == DRY_RUN
        return None if self.forwarded(verdict, dry) else verdict.refusal()

    def credential_refusal(self, ctx: RequestContext) -> StatusError | None:
        """The 401 when the watch's request no longer authenticates as the identity it was
        opened with (its token removed, its key rotated away, its JWT expired)."""
        try:
            now = self.authenticate(ctx.request)
        except StatusError as exc:
            return exc
        if now != ctx.identity:
            return unauthorized("the credential of this watch now names another identity")
        return None


class WatchRelay:
    """The forwarded exchanges of this process, and among them the open watches."""

    def __init__(
        self,
        pool_size: int,
        max_watch_seconds: float = DEFAULT_MAX_WATCH_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.pool_size = pool_size
        self.max_watch_seconds = max_watch_seconds
        self.poll_seconds = poll_seconds
        self.draw = draw
        self.exchanges: dict[asyncio.Task[Any], Exchange] = {}
        self.watches: dict[Exchange, OpenWatch] = {}
        self.terms: WatchTerms | None = None
        self._latest: PolicyBundle | None = None
        self._poller: asyncio.Task[None] | None = None
        self._checker: asyncio.Task[None] | None = None

    def follow(self, terms: WatchTerms) -> None:
        """Let open watches follow the policy and their credentials (app.py wires the
        reloads to `policy_changed` and `credentials_changed`)."""
        self.terms = terms

    async def run(
        self,
        ctx: RequestContext,
        forward: Callable[[RequestContext, Exchange], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """`forward(ctx, exchange)`, let go within a second of its client going away;
        for a watch, also ended when its terms end."""
        task = asyncio.current_task()
        assert task is not None
        exchange = Exchange(ctx.request, task)
        watching = ctx.target is not None and ctx.target.verb == "watch"
        if watching:
            self._open(ctx, exchange)
        self.exchanges[task] = exchange
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        # The connection tells of its own end (`sidecar serve`'s connections): the
        # exchange is let go at once; the poller is the fallback for other servers.
        protocol = ctx.request.protocol
        hooked = protocol if isinstance(protocol, DeadlineHandler) else None
        if hooked is not None:
            hooked.on_lost = exchange.lost
        try:
            return await forward(ctx, exchange)
        except asyncio.CancelledError:
            if not exchange.absorb():
                raise
            raise self._outcome(exchange) from None
        except (StatusError, OSError, ValueError):
            # The cancellation may have surfaced as another error (a connection aborted
            # under a read): the client is gone all the same.
            if exchange.gone:
                exchange.absorb()
                raise ConnectionResetError("the client went away") from None
            raise
        finally:
            if hooked is not None:
                hooked.on_lost = None
            del self.exchanges[task]
            if watching:
                self.watches.pop(exchange, None)

    def _outcome(self, exchange: Exchange) -> Exception:
        if exchange.gone:
            return ConnectionResetError("the client went away")
        return exchange.refusal or StatusError(503, "the watch was ended; watch again")

    def _open(self, ctx: RequestContext, exchange: Exchange) -> None:
        """Admit and register a watch: a place in the watch pool, its credential still
        good, its own lifetime; a policy swapped in since it was decided is applied."""
        if len(self.watches) >= self.pool_size:
            raise StatusError(
                503,
                f"all {self.pool_size} upstream connections for watches are in use; retry shortly",
                headers={"Retry-After": "1"},
            )
        terms = self.terms
        loop = asyncio.get_running_loop()
        now = loop.time()
        lifetime = watch_lifetime(self.max_watch_seconds, self.draw)
        deadline = now + lifetime
        reason = f"it reached its lifetime ({lifetime:.0f} s, limits.maxWatchSeconds)"
        refusal = StatusError(504, "the upstream did not answer the watch within its lifetime")
        if terms is not None and ctx.identity is not None:
            # Authenticated before any await of the stages in between; a credential
            # reload since then is applied here.
            gone = terms.credential_refusal(ctx)
            if gone is not None:
                raise gone
            expires = terms.expires_at(ctx.request, ctx.identity)
            if expires is not None and now + (expires - time.time()) < deadline:
                deadline = now + (expires - time.time())
                reason = "its credential expired"
                refusal = unauthorized("the token has expired")
        watch = OpenWatch(exchange, ctx, lifetime, deadline, reason, refusal, ctx.policy)
        self.watches[exchange] = watch
        if terms is not None and ctx.policy is not terms.current_policy():
            self.policy_changed(terms.current_policy())

    # -- ending -------------------------------------------------------------------

    def end(self, exchange: Exchange, reason: str, refusal: StatusError) -> None:
        """End a watch now: its upstream connection is closed and its answer ended
        cleanly (or `refusal` answered, when its answer has not started)."""
        if exchange.ended or exchange.gone or exchange.task.done():
            return
        exchange.ended = reason
        exchange.refusal = refusal
        watch = self.watches.get(exchange)
        log.info("ending a watch (request %s): %s", watch.ctx.request_id if watch else "?", reason)
        self._cancel(exchange)

    def _cut(self, exchange: Exchange) -> None:
        """The client is gone: end the exchange as a 499."""
        exchange.lost()

    def _cancel(self, exchange: Exchange) -> None:
        if not exchange.cancelled:
            exchange.cancelled = True
            exchange.task.cancel()

    def close_all(self) -> None:
        """End every open watch now (SIGTERM): its upstream connection closed, its answer
        ended cleanly (a watch not answered yet gets a 503), so the client re-watches."""
        for exchange in list(self.watches):
            refusal = StatusError(503, "the sidecar is shutting down; watch again")
            self.end(exchange, "the sidecar is shutting down", refusal)

    # -- following the policy and the credentials ------------------------------------

    def policy_changed(self, bundle: PolicyBundle) -> None:
        """A new policy is in force: decide every open watch again with it."""
        self._latest = bundle
        if self.watches and (self._checker is None or self._checker.done()):
            self._checker = asyncio.create_task(self._recheck(), name="watch-recheck")

    async def _recheck(self) -> None:
        # No await between finding nothing left to check and returning, so a swap that
        # `policy_changed` records is always seen by this task or starts a new one.
        terms = self.terms
        while terms is not None:
            bundle = self._latest
            stale = [w for w in self.watches.values() if w.policy is not bundle]
            if bundle is None or not stale:
                return
            for watch in stale:
                exchange = watch.exchange
                if exchange.ended or exchange.gone or self.watches.get(exchange) is not watch:
                    continue
                try:
                    refusal = await terms.policy_refusal(watch.ctx, bundle)
                except Exception:
                    log.exception("deciding an open watch again failed; ending it")
                    refusal = StatusError(503, "the watch could not be decided again; watch again")
                watch.policy = bundle
                if refusal is not None:
                    self.end(exchange, "the policy in force no longer allows it", refusal)

    def credentials_changed(self) -> None:
        """The credential files were reloaded: end the watches whose credential went."""
        terms = self.terms
        if terms is None:
            return
        for exchange, watch in list(self.watches.items()):
            refusal = terms.credential_refusal(watch.ctx)
            if refusal is not None:
                self.end(exchange, "its credential is no longer accepted", refusal)

    # -- the poller ---------------------------------------------------------------------

    async def _poll(self) -> None:
        # No await between the emptiness check and returning, so an exchange that `run`
        # adds is always seen by this poller or starts a new one.
        loop = asyncio.get_running_loop()
        while self.exchanges:
            await asyncio.sleep(self.poll_seconds)
            for exchange in list(self.exchanges.values()):
                if not exchange.gone and client_gone(exchange.request):
                    self._cut(exchange)
            now = loop.time()
            for watch in list(self.watches.values()):
                if now >= watch.deadline:
                    self.end(watch.exchange, watch.deadline_reason, watch.deadline_refusal)

    async def close(self) -> None:
        """Stop the background tasks (the app is shutting down)."""
        for task in (self._poller, self._checker):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


__all__ = [
    "Exchange",
    "OpenWatch",
    "WatchRelay",
    "WatchTerms",
    "client_gone",
    "watch_lifetime",
]

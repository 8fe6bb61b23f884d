"""The decider: the full proxy's decision for a request described by a front (DESIGN §13).

A front (Envoy, nginx) describes the request it holds: method, raw target, the
client's headers and address. The decider runs the proxy's own stages on that
description, the same objects `sidecar.app.build_app` built for the proxy (metrics,
audit, errors, the anonymous rate limit, parse, identity, the tenant rate limit on the
same buckets, impersonation), then the decision of the authorize stage
(`Authorizer.authorize`, with the same decision cache and owner lookup). So every
refusal is the proxy's refusal, byte for byte: the same status, Status body and
headers (`WWW-Authenticate`, `Retry-After`, `RateLimit-*`), the same concealing 404.

An allow names a route (`sidecar.edge.authz.route`): `direct` when the front may
forward the request itself, `proxy` when only the full proxy can do it. A `proxy`
allow carries the "already decided" marker (`marker.py`), so the proxy does not
charge the tenant's rate limit a second time.

The hot path: an allow that is `direct` is remembered per (method, raw target,
Authorization) for the policy snapshot, the credentials and (for a JWT) until the
token's `exp`; a later identical description is answered from that entry after only
the stages that must run per request: the rate limit (every request spends from its
tenant's bucket), metrics and the audit line. Descriptions with impersonation headers
are never answered from the cache. The answer's headers are built once per entry.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.core.identity import Identity
from sidecar.core.status import bad_request
from sidecar.core.target import RequestTarget
from sidecar.edge.authz import route as routes
from sidecar.edge.authz.hit_audit import HitAuditStage, HitLine
from sidecar.edge.authz.marker import HEADER as MARKER_HEADER
from sidecar.edge.authz.marker import Marker
from sidecar.pipeline.audit import AuditStage
from sidecar.pipeline.authorize import Authorizer, forwarded
from sidecar.pipeline.chain import Handler, Stage, build_chain
from sidecar.pipeline.context import RequestContext, request_id_for
from sidecar.pipeline.ratelimit import TenantRateLimitStage
from sidecar.pipeline.tenant_context import enter as enter_tenant_context
from sidecar.services.audit import authz_record

if TYPE_CHECKING:
    from sidecar.config.settings import Config
    from sidecar.pipeline.identity import IdentityStage
    from sidecar.policy.decision import Verdict
    from sidecar.policy.source.store import PolicyStore
    from sidecar.services.identity.credentials import CredentialWatcher
    from sidecar.services.metrics import Metrics

ROUTE_HEADER = "x-sidecar-route"
DIRECT, PROXY = "direct", "proxy"
# Headers a described request never carries into the decision: identity headers the
# front's client may have sent (the decider is reached through a front, so the trusted
# header authenticator never applies to it) and the sidecar's own answer headers.
_DROPPED_PREFIXES = ("x-remote-", "x_remote_", "x-remote_", "x_remote-", "x-sidecar-", "x_sidecar_")
# Identity headers the decider sees but the front must not forward on `direct`.
_IDENTITY_LIKE = ("impersonate-", "impersonate_")
_SPOOFABLE = _DROPPED_PREFIXES + _IDENTITY_LIKE
# The audit note of a request that carried identity headers of its own.
SPOOFED = "clientIdentityHeaders"
# The stages of the proxy's list that the decider runs, in the proxy's order.
DECIDER_STAGES = (
    "metrics",
    "audit",
    "errors",
    "ratelimit-anonymous",
    "parse",
    "identity",
    "ratelimit",
    "tenant-context",
    "impersonation",
)
# Only keys up to these lengths are cached, so the cache holds at most about
# `authz.cache` x 2.5 KiB of keys whatever callers send (a long target or token is
# decided every time, as the parse stage's cache does).
MAX_CACHED_TARGET = 512
MAX_CACHED_CREDENTIAL = 2048
# What a cache hit still runs per request.
HIT_STAGES = ("metrics", "audit", "errors", "ratelimit")


@dataclass(frozen=True, slots=True)
class Allowed:
    """An allow: the route, and the headers the front sets on the forwarded request.
    `wire`: its encoded answer per front, filled once by the listener."""

    route: str
    headers: tuple[tuple[str, str], ...]
    wire: dict[str, bytes] = field(default_factory=dict, compare=False)


@dataclass(slots=True)
class Decided:
    """The decider's answer: an allow, or the proxy's refusal as a response."""

    allowed: Allowed | None
    refusal: web.Response | None


@dataclass(slots=True)
class _Entry:
    decided: Decided
    # The answer the hit chain's stages see (shared, never written: the listener
    # writes `decided`'s pre-encoded form).
    response: web.Response
    identity: Identity
    target: RequestTarget
    verdict: Verdict
    policy: object
    authenticators: object
    expires: float | None
    audit_authz: dict[str, object]
    audit_line: HitLine
    # The mode in force for the caller's tenant (a TenantMode may make it dry-run).
    mode: str


class _Seen:
    """What the audit line and the stages read of a request answered from the cache:
    a stand-in for the described `web.Request` (method, raw target, client, headers)."""

    __slots__ = ("headers", "method", "raw_path", "remote")

    def __init__(self, method: str, raw_path: str, remote: str, headers: dict[str, str]) -> None:
        self.method = method
        self.raw_path = raw_path
        self.remote = remote
        self.headers = headers


class Decider:
    """Decides described requests with the proxy's stages and services."""

    def __init__(
        self,
        config: Config,
        policy: PolicyStore,
        stages: Sequence[Stage],
        authorizer: Authorizer,
        identity: IdentityStage,
        credentials: CredentialWatcher,
        metrics: Metrics,
        marker: Marker,
    ) -> None:
        self.config = config
        self.policy = policy
        self.authorizer = authorizer
        self.identity = identity
        self.credentials = credentials
        self.metrics = metrics
        self.marker = marker
        self.max_body = config.limits.max_body_bytes
        self.mode = config.mode
        by_name = {s.name: s for s in stages}
        limiter = cast(TenantRateLimitStage, by_name["ratelimit"]).limiter
        # The decider's own rate-limit stage, on the proxy's buckets (the proxy's one
        # skips requests with a valid marker; the decider's always charges).
        own: dict[str, Stage] = {**by_name, "ratelimit": TenantRateLimitStage(limiter)}
        self._chain: Handler = build_chain([own[n] for n in DECIDER_STAGES], self._decide)
        audit = cast(AuditStage, by_name["audit"]).audit
        hit = {**own, "audit": HitAuditStage(audit)}
        self._hit_chain: Handler = build_chain([hit[n] for n in HIT_STAGES], self._answer_hit)
        self._cache: OrderedDict[tuple[str, str, str], _Entry] = OrderedDict()
        self._cache_size = max(0, config.authz.cache)
        self.strip = config.identity.strip_header_names

    # -- the entry ----------------------------------------------------------------------

    async def decide(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        remote: str,
        *,
        joined: bool = False,
    ) -> Decided:
        """Decide `method target` with the client's `headers`, sent from `remote`.
        `joined`: the front joins repeated headers into one (Envoy's check does), so an
        `Impersonate-*` value holding a `,` cannot be read as the proxy reads it (two
        `Impersonate-Group` headers or one group named `a,b`): such a request is left
        to the proxy, undecided here and uncharged, never refused on a guess."""
        if not target.startswith("/") or target.startswith("//"):
            raise bad_request("the described request target must be an absolute path")
        # One pass for what the cache needs. Headers the upstream could act on as
        # identity, sent by the client, make the request go the `proxy` way (the proxy
        # strips them; a front strips by name, not by prefix) and keep it out of the
        # cache.
        authorization, credentials, request_id, spoofed = "", 0, "", 0
        strip = self.strip
        for k, v in headers:
            lower = k.lower()
            if lower == "authorization":
                authorization, credentials = v, credentials + 1
            elif lower == "x-request-id":
                request_id = v
            elif lower.startswith(_SPOOFABLE) or (strip and lower.replace("_", "-") in strip):
                spoofed += 1
        key = (method, target, authorization)
        cacheable = (
            credentials == 1
            and not spoofed
            and len(target) <= MAX_CACHED_TARGET
            and len(authorization) <= MAX_CACHED_CREDENTIAL
        )
        if cacheable:
            entry = self._cache.get(key)
            if entry is not None and self._valid(entry):
                return await self._hit(entry, method, target, remote, request_id)
        if joined and spoofed and _ambiguous(headers):
            return Decided(Allowed(PROXY, ((ROUTE_HEADER, PROXY),)), None)
        described = CIMultiDict[str](
            (k, v) for k, v in headers if not k.lower().startswith(_DROPPED_PREFIXES)
        )
        try:
            request = described_request(method, target, described, remote)
        except (ValueError, UnicodeEncodeError):
            raise bad_request("the described request cannot be read") from None
        # A `/tenants/{t}` context path is read as the proxy's dispatch reads it: the
        # rest of the target, in `t` (its parse, who may use it, the marker's target).
        request = enter_tenant_context(request)
        if routes.is_probe(request.path):
            # The proxy answers its probes without any stage: no decision, no charge.
            return Decided(Allowed(PROXY, ((ROUTE_HEADER, PROXY),)), None)
        ctx = RequestContext(
            request=request,
            request_id=request_id_for(request),
            policy=self.policy.current,
            max_body_bytes=self.max_body,
            mode=self.mode,
        )
        if spoofed:
            ctx.audit[SPOOFED] = spoofed
        response = await self._chain(ctx)
        decided = _result(response)
        if cacheable and decided.allowed is not None and decided.allowed.route == DIRECT:
            self._remember(key, ctx, decided)
        return decided

    async def _hit(
        self, entry: _Entry, method: str, target: str, remote: str, request_id: str
    ) -> Decided:
        """A cached direct allow: charged, counted and audited like any request."""
        seen = _Seen(method, target, remote, {"X-Request-Id": request_id} if request_id else {})
        request = cast(web.Request, seen)
        ctx = RequestContext(
            request=request,
            request_id=request_id_for(request),
            policy=entry.policy,  # type: ignore[arg-type]
            max_body_bytes=self.max_body,
            mode=entry.mode,
        )
        ctx.identity = entry.identity
        ctx.target = entry.target
        ctx.decision = entry.verdict
        # The entry, for the hit chain's terminal (the context has no other slot for
        # it; no stage of that chain reads a body).
        ctx.parsed_body = entry
        ctx.audit["authenticator"] = entry.identity.authenticator
        ctx.audit["authz"] = entry.audit_authz
        ctx.audit["decider"] = DIRECT
        response = await self._hit_chain(ctx)
        if response is entry.response:
            return entry.decided
        return _result(response)

    # -- the decision (the terminal of the decider's chain) -------------------------------

    async def _decide(self, ctx: RequestContext) -> web.StreamResponse:
        # The decoded path, as the proxy dispatches its own terminals.
        proxy_only = routes.terminal_route(ctx.request.path)
        if proxy_only is not None:
            # Probes, the quota API: the proxy answers these itself, deciding each call.
            return self._allow(ctx, PROXY)
        identity, target = ctx.authenticated(), ctx.target
        if target is None:
            raise bad_request("the request target could not be parsed")
        if routes.is_review_target(target):
            return self._allow(ctx, PROXY)
        authz = self.authorizer
        v = await authz.authorize(ctx, identity, target, read_body=False)
        ctx.decision = v
        ctx.audit["authz"] = authz_record(v)
        label = self.metrics.tenant(identity.tenant)
        if not v.allowed and forwarded(v, ctx.dry_run):
            # A refusal the mode relaxes: the proxy forwards it as the verdict asks.
            self.metrics.child(self.metrics.decisions, label, "would_deny").inc()
            return self._allow(ctx, PROXY)
        self.metrics.child(self.metrics.decisions, label, v.outcome).inc()
        if not v.allowed:
            raise v.refusal()
        way = routes.route_for(ctx, v, self.strip)
        return self._allow(ctx, way)

    def _allow(self, ctx: RequestContext, way: str) -> web.Response:
        ctx.audit["decider"] = way
        headers: list[tuple[str, str]] = [(ROUTE_HEADER, way)]
        identity = ctx.identity
        if way == DIRECT and identity is not None:
            headers += identity_headers(identity)
        if way == PROXY:
            request = ctx.request
            headers.append(
                (
                    MARKER_HEADER,
                    self.marker.sign(
                        request.method,
                        request.raw_path,
                        request.headers.get("Authorization", ""),
                    ),
                )
            )
        response = web.Response(status=200, headers=CIMultiDict(headers))
        for name, value in ctx.response_headers.items():
            response.headers.setdefault(name, value)
        return response

    # -- the cache ------------------------------------------------------------------------

    def _valid(self, entry: _Entry) -> bool:
        if entry.policy is not self.policy.current:
            return False
        if entry.authenticators is not self.identity.authenticators:
            return False
        return entry.expires is None or time.time() < entry.expires

    async def _answer_hit(self, ctx: RequestContext) -> web.StreamResponse:
        entry = cast(_Entry, ctx.parsed_body)
        metrics = self.metrics
        metrics.child(metrics.decisions, metrics.tenant(entry.identity.tenant), "allow").inc()
        ctx.status = 200
        return entry.response

    def _remember(self, key: tuple[str, str, str], ctx: RequestContext, decided: Decided) -> None:
        if not self._cache_size or ctx.identity is None or ctx.target is None:
            return
        v = ctx.decision
        if v is None or v.needs_object or ctx.identity.impersonated_by is not None:
            return  # an owner's answer may change; impersonation is decided each time
        assert decided.allowed is not None
        expires = self.credentials.expires_at(ctx.request, ctx.identity)
        authz = dict(ctx.audit.get("authz") or {})
        cache = self._cache
        if len(cache) >= self._cache_size:
            cache.popitem(last=False)
        cache[key] = _Entry(
            decided=decided,
            response=web.Response(status=200, headers=CIMultiDict(decided.allowed.headers)),
            identity=ctx.identity,
            target=ctx.target,
            verdict=v,
            policy=ctx.policy,
            authenticators=self.identity.authenticators,
            expires=expires,
            audit_authz=authz,
            mode=ctx.mode,
            audit_line=HitLine(
                ctx.identity,
                ctx.target,
                v,
                {"authenticator": ctx.identity.authenticator, "authz": authz, "decider": DIRECT},
            ),
        )


class _NoConnection:
    """The connection of a described request: none (the decider never reads a body
    nor writes an answer on it)."""

    ssl_context = None
    peername = None
    sockname = None
    transport = None
    writer = None


_NO_CONNECTION = _NoConnection()


def described_request(
    method: str, target: str, headers: CIMultiDict[str], remote: str
) -> web.Request:
    """An aiohttp request for the description: what the proxy's stages read of a
    request (method, raw target, headers, client address), with no body."""
    frozen = CIMultiDictProxy(headers)
    raw = tuple((k.encode("utf-8"), v.encode("utf-8")) for k, v in headers.items())
    message = RawRequestMessage(
        method,
        target,
        HttpVersion11,
        frozen,
        raw,
        False,
        None,
        False,
        False,
        URL(target, encoded=True),
    )
    loop = asyncio.get_running_loop()
    return web.Request(
        message,
        EMPTY_PAYLOAD,
        cast(Any, _NO_CONNECTION),
        cast(Any, None),
        cast(Any, asyncio.current_task()),
        loop,
        remote=remote,
    )


def identity_headers(identity: Identity) -> list[tuple[str, str]]:
    """The identity the proxy would forward (DESIGN §4): one `x-remote-group` per group."""
    out = [("x-remote-user", identity.user), ("x-remote-tenant", identity.tenant)]
    out += [("x-remote-group", group) for group in identity.groups]
    return out


def _ambiguous(headers: Sequence[tuple[str, str]]) -> bool:
    """Whether an impersonation header may be several the front joined."""
    return any(k.lower().startswith(_IDENTITY_LIKE) and "," in v for k, v in headers)


_ALLOW_ONLY = frozenset({ROUTE_HEADER, "x-remote-user", "x-remote-tenant", "x-remote-group"})


def _result(response: web.StreamResponse) -> Decided:
    if response.status == 200 and ROUTE_HEADER in response.headers:
        headers = tuple(
            (k.lower(), v)
            for k, v in response.headers.items()
            if k.lower() in _ALLOW_ONLY or k.lower() == MARKER_HEADER
        )
        return Decided(Allowed(response.headers[ROUTE_HEADER], headers), None)
    assert isinstance(response, web.Response)
    return Decided(None, response)


__all__ = [
    "DIRECT",
    "PROXY",
    "ROUTE_HEADER",
    "Allowed",
    "Decided",
    "Decider",
    "identity_headers",
]

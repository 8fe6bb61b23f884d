"""Envoy's HTTP ext_authz (`path_prefix: /envoy`, DESIGN §13).

Envoy asks with the client's method and `/envoy` + the client's `:path` (query
included), and the headers its `allowed_headers` pass. Allow: 200, empty body, the
route and identity headers (`allowed_upstream_headers` copies them onto the
forwarded request, replacing any the client sent). Deny: the proxy's status, headers
and Status body, which Envoy hands to the client as they are.
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

from sidecar.core.status import bad_request
from sidecar.edge.authz.decider import Decided, Decider
from sidecar.edge.authz.describe import client_address, client_headers
from sidecar.edge.server import Route

PREFIX = "/envoy"


def answer(decided: Decided) -> web.Response:
    if decided.allowed is not None:
        return web.Response(status=200, headers=CIMultiDict(decided.allowed.headers))
    assert decided.refusal is not None
    return decided.refusal


def handler(decider: Decider) -> Route:
    async def check(request: web.Request) -> web.StreamResponse:
        raw = request.raw_path
        if not raw.startswith(PREFIX + "/"):
            raise bad_request("an Envoy check must ask for /envoy followed by the request path")
        decided = await decider.decide(
            request.method,
            raw[len(PREFIX) :],
            client_headers(request),
            client_address(request),
        )
        return answer(decided)

    return check

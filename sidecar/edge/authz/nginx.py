"""nginx `auth_request` (`GET /nginx`, DESIGN §13).

nginx's subrequest is always a GET with the client's headers and no body; the
generated config adds `X-Original-Method` and `X-Original-URI` (`$request_uri`, the
target as the client sent it) and `X-Original-Remote-Addr`. Allow: `204`, empty body
(so the keep-alive connection is reused), the route and identity headers, which
`auth_request_set` reads. nginx passes only 401 and 403 on (anything else becomes its
500), so a refusal is answered 401 (with `WWW-Authenticate`) or 403, with
`x-decision-status` naming the proxy's status and `x-decision` carrying the whole
refusal (status, headers, Status body; signed with the marker's key). The config's
`error_page 401 403 = @denied` asks `GET /nginx/denied` with that `x-decision`, and gets
the proxy's exact answer back: the refusal is replayed, never decided (or charged)
again. `/nginx/denied` without a valid `x-decision` is a 403, never an allow.

`x-remote-group` is one header with the groups joined by `,` (nginx's
`$upstream_http_…` variable holds one header); a request of a caller whose group names
hold a `,` goes the `proxy` way.
"""

from __future__ import annotations

import json

from aiohttp import web
from multidict import CIMultiDict

from sidecar.core.status import StatusError, bad_request
from sidecar.edge.authz.decider import Decided, Decider
from sidecar.edge.authz.describe import client_address, client_headers
from sidecar.edge.authz.marker import Marker
from sidecar.edge.server import Route

PREFIX = "/nginx"
DENIED = "/nginx/denied"
DECISION = "x-decision"
DECISION_STATUS = "x-decision-status"
_KEEP = (
    "content-type",
    "www-authenticate",
    "retry-after",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "allow",
    "x-request-id",
)


def answer(decided: Decided, marker: Marker) -> web.Response:
    if decided.allowed is not None:
        headers = CIMultiDict[str]()
        groups: list[str] = []
        for name, value in decided.allowed.headers:
            if name == "x-remote-group":
                groups.append(value)
            else:
                headers.add(name, value)
        if groups:
            headers["x-remote-group"] = ",".join(groups)
        return web.Response(status=204, headers=headers)
    refusal = decided.refusal
    assert refusal is not None
    body = refusal.body if isinstance(refusal.body, bytes) else b""
    kept = [(k, v) for k, v in refusal.headers.items() if k.lower() in _KEEP]
    payload = json.dumps(
        {"s": refusal.status, "h": kept, "b": body.decode("utf-8", "replace")},
        separators=(",", ":"),
    ).encode()
    status = 401 if refusal.status == 401 else 403
    headers = CIMultiDict[str]()
    if status == 401 and "WWW-Authenticate" in refusal.headers:
        headers["WWW-Authenticate"] = refusal.headers["WWW-Authenticate"]
    headers[DECISION_STATUS] = str(refusal.status)
    headers[DECISION] = marker.seal(payload)
    return web.Response(status=status, headers=headers)


def replay(request: web.Request, marker: Marker) -> web.Response:
    """`/nginx/denied`: the refusal `x-decision` carries, exactly."""
    sealed = request.headers.get(DECISION, "")
    payload = marker.unseal(sealed) if sealed else None
    if payload is None:
        raise StatusError(403, "the request was refused (no decision to show)")
    try:
        doc = json.loads(payload)
        status, kept, body = int(doc["s"]), doc["h"], str(doc["b"]).encode()
        headers = CIMultiDict[str]((str(k), str(v)) for k, v in kept)
    except (ValueError, KeyError, TypeError):
        raise StatusError(403, "the request was refused (no decision to show)") from None
    return web.Response(status=status, body=body, headers=headers)


def handler(decider: Decider) -> Route:
    marker = decider.marker

    async def check(request: web.Request) -> web.StreamResponse:
        if request.raw_path.partition("?")[0] == DENIED:
            return replay(request, marker)
        method = request.headers.get("X-Original-Method", "")
        target = request.headers.get("X-Original-URI", "")
        if not method or not target:
            raise bad_request("an nginx check needs X-Original-Method and X-Original-URI")
        if not method.isalpha() or not method.isupper():
            raise bad_request("X-Original-Method is not an HTTP method")
        decided = await decider.decide(
            method, target, client_headers(request), client_address(request)
        )
        return answer(decided, marker)

    return check

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

from sidecar.core.status import StatusError, bad_request
from sidecar.edge.authz.decider import Decided, Decider
from sidecar.edge.authz.describe import client_address, client_headers
from sidecar.edge.authz.fastserver import Handler, Question, encode
from sidecar.edge.authz.marker import Marker

PREFIX = "/nginx"
DENIED = "/nginx/denied"
DECISION = "x-decision"
DECISION_STATUS = "x-decision-status"
# A refusal's body carried whole in `x-decision` up to this size (the generated config's
# proxy_buffer_size is 32k); a larger one is replayed as a plain Status of its status.
MAX_SEALED_BODY = 12 * 1024
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


def answer(decided: Decided, marker: Marker) -> bytes:
    allowed = decided.allowed
    if allowed is not None:
        wire = allowed.wire.get("nginx")
        if wire is None:
            sent = [(k, v) for k, v in allowed.headers if k != "x-remote-group"]
            groups = [v for k, v in allowed.headers if k == "x-remote-group"]
            if groups:
                sent.append(("x-remote-group", ",".join(groups)))
            wire = allowed.wire["nginx"] = encode(204, sent)
        return wire
    refusal = decided.refusal
    assert refusal is not None
    body = refusal.body if isinstance(refusal.body, bytes) else b""
    kept = [(k, v) for k, v in refusal.headers.items() if k.lower() in _KEEP]
    if len(body) > MAX_SEALED_BODY:  # a refusal naming a very long target
        body = StatusError(refusal.status, "the request was refused").body_bytes()
    payload = json.dumps(
        {"s": refusal.status, "h": kept, "b": body.decode("utf-8", "replace")},
        separators=(",", ":"),
    ).encode()
    status = 401 if refusal.status == 401 else 403
    # No WWW-Authenticate here: nginx would copy it to the client and the replay
    # (`/nginx/denied`) sends the proxy's own, so the client would get two.
    headers: list[tuple[str, str]] = [(DECISION_STATUS, str(refusal.status))]
    headers.append((DECISION, marker.seal(payload)))
    return encode(status, headers)


def replay(question: Question, marker: Marker) -> bytes:
    """`/nginx/denied`: the refusal `x-decision` carries, exactly."""
    sealed = question.header(DECISION) or ""
    payload = marker.unseal(sealed) if sealed else None
    if payload is None:
        raise StatusError(403, "the request was refused (no decision to show)")
    try:
        doc = json.loads(payload)
        status, kept, body = int(doc["s"]), doc["h"], str(doc["b"]).encode()
        replayed = [(str(k), str(v)) for k, v in kept]
    except (ValueError, KeyError, TypeError):
        raise StatusError(403, "the request was refused (no decision to show)") from None
    return encode(status, replayed, body)


def handler(decider: Decider) -> Handler:
    marker = decider.marker

    async def check(question: Question) -> bytes:
        if question.target.partition("?")[0] == DENIED:
            return replay(question, marker)
        method = question.header("x-original-method") or ""
        target = question.header("x-original-uri") or ""
        if not method or not target:
            raise bad_request("an nginx check needs X-Original-Method and X-Original-URI")
        if not method.isalpha() or not method.isupper():
            raise bad_request("X-Original-Method is not an HTTP method")
        decided = await decider.decide(
            method, target, client_headers(question), client_address(question)
        )
        return answer(decided, marker)

    return check

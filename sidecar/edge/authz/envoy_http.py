"""Envoy's HTTP ext_authz (`path_prefix: /envoy`, DESIGN §13).

Envoy asks with the client's method and `/envoy` + the client's `:path` (query
included), and the headers its `allowed_headers` pass. Allow: 200, empty body, the
route and identity headers (`allowed_upstream_headers` copies them onto the
forwarded request, replacing any the client sent; `x-remote-group` is repeated, one
per group, and appended). Deny: the proxy's status, headers and Status body, which
Envoy hands to the client as they are.
"""

from __future__ import annotations

from sidecar.core.status import bad_request
from sidecar.edge.authz.answers import response_bytes
from sidecar.edge.authz.decider import Decided, Decider
from sidecar.edge.authz.describe import client_address, client_headers
from sidecar.edge.authz.fastserver import Handler, Question, encode

PREFIX = "/envoy"


def answer(decided: Decided) -> bytes:
    allowed = decided.allowed
    if allowed is not None:
        wire = allowed.wire.get("envoy")
        if wire is None:
            wire = allowed.wire["envoy"] = encode(200, allowed.headers)
        return wire
    assert decided.refusal is not None
    return response_bytes(decided.refusal)


def handler(decider: Decider) -> Handler:
    async def check(question: Question) -> bytes:
        raw = question.target
        if not raw.startswith(PREFIX + "/"):
            raise bad_request("an Envoy check must ask for /envoy followed by the request path")
        decided = await decider.decide(
            question.method,
            raw[len(PREFIX) :],
            client_headers(question),
            client_address(question),
            joined=True,
        )
        return answer(decided)

    return check

"""What a front's question says about the client's request: the headers to decide on
and the client's address (DESIGN §13)."""

from __future__ import annotations

from aiohttp import web

# Headers of the front's own call to the decider, never the client's request's.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "content-length",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
        "x-original-method",
        "x-original-uri",
        "x-original-remote-addr",
        "x-envoy-expected-rq-timeout-ms",
        "x-envoy-internal",
    }
)


def client_headers(request: web.Request) -> list[tuple[str, str]]:
    """The client's headers as the front passed them on."""
    return [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]


def client_address(request: web.Request) -> str:
    """The client's address: `X-Original-Remote-Addr` (nginx's generated config sets it
    from `$remote_addr`), else the last `X-Forwarded-For` entry (Envoy's generated
    config appends the peer's address, `use_remote_address`), else the front's own."""
    given = request.headers.get("X-Original-Remote-Addr")
    if given:
        return given.strip()
    forwarded = request.headers.getall("X-Forwarded-For", ())
    if forwarded:
        last = forwarded[-1].rsplit(",", 1)[-1].strip()
        if last:
            return last
    return request.remote or "unknown"

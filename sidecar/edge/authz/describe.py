"""What a front's question says about the client's request: the headers to decide on
and the client's address (DESIGN §13)."""

from __future__ import annotations

from sidecar.edge.authz.fastserver import Question

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


def client_headers(question: Question) -> list[tuple[str, str]]:
    """The client's headers as the front passed them on."""
    return [(k, v) for k, v in question.headers if k.lower() not in _HOP]


def client_address(question: Question) -> str:
    """The client's address: `X-Original-Remote-Addr` (nginx's generated config sets it
    from `$remote_addr`), else the last `X-Forwarded-For` entry (Envoy's generated
    config appends the peer's address, `use_remote_address`), else the front's own."""
    forwarded = ""
    for name, value in question.headers:
        lower = name.lower()
        if lower == "x-original-remote-addr" and value.strip():
            return value.strip()
        if lower == "x-forwarded-for":
            forwarded = value
    if forwarded:
        last = forwarded.rsplit(",", 1)[-1].strip()
        if last:
            return last
    return question.remote or "unknown"

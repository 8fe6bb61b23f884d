"""Class "two readings" (DESIGN §1, §3, §8), the differential property: for generated
request targets (percent-encoded keys and values in any case, `+` vs `%20`, `;`, `#`,
duplicates, empty values, `%00`, non-ASCII, encoded separators), either the sidecar
refuses the target and forwards nothing, or the upstream's reading of what the sidecar
forwarded (aiohttp/yarl, exactly as the backing store reads path and `request.query`)
equals the sidecar's reading: verb, tenant, namespace, group, resource, subresource,
name, watch, selectors, dryRun, owner.

Real processes: the sidecar as a process, the reading upstream as a real aiohttp server
(tests/rigs/upstream_reader.py), raw sockets so every byte of the target is sent as
generated. On the code before the one-reading rebuild this finds `…?x=1#&fieldSelector=…`
(the upstream drops the fragment, the sidecar read the selector) and `?%77atch=true`
(the sidecar read a list, the upstream a watch)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar.core.target import TargetError, parse_target
from tests.rigs import processes
from tests.rigs.paths import ROOT
from tests.rigs.upstream_reader import UpstreamReader, reading_of

CALLER_TENANT = "system"


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[processes.Proc, UpstreamReader]]:
    tmp = tmp_path_factory.mktemp("differential")
    reader = UpstreamReader().start()
    tokens = processes.write_tokens(
        tmp, [{"token": "admin", "user": "admin", "tenant": CALLER_TENANT, "groups": []}]
    )
    config: dict[str, Any] = {
        "upstream": reader.url,
        "policies": str(ROOT / "tests" / "fixtures" / "allow_admin"),
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
        "audit": {"path": str(tmp / "audit.log")},
    }
    sidecar = processes.start_sidecar(tmp, config)
    try:
        yield sidecar, reader
    finally:
        sidecar.stop()
        reader.stop()


def send(port: int, method: str, target: str, request_id: str) -> int:
    """One request with the target's bytes exactly as given; the answer's status."""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer admin\r\n"
        f"X-Request-Id: {request_id}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode("utf-8", "surrogateescape"))
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


# -- generated targets --------------------------------------------------------------

_HEX = "0123456789abcdefABCDEF"


@st.composite
def spelled(draw: st.DrawFn, text: str, plus: bool = False) -> str:
    """`text` with each character raw or percent-encoded (either hex case); in a query
    a space may also be `+`."""
    out = []
    for ch in text:
        raw = ch.encode("utf-8")
        choices = (
            ["raw", "pct"] if ch.isascii() and ch.isprintable() and ch not in " %#?&=+" else ["pct"]
        )
        if plus and ch == " ":
            choices.append("plus")
        how = draw(st.sampled_from(choices))
        if how == "raw":
            out.append(ch)
        elif how == "plus":
            out.append("+")
        else:
            upper = draw(st.booleans())
            out.append("".join(f"%{b:02X}" if upper else f"%{b:02x}" for b in raw))
    return "".join(out)


NAMES = st.sampled_from(
    ["web", "app-config", "a b", "a/b", "a;b", "é", "x+y", "..", "n1", "a%b", "A", "tag,1"]
)
KEYS = st.sampled_from(
    [
        "watch",
        "fieldSelector",
        "labelSelector",
        "dryRun",
        "owner",
        "resourceVersion",
        "timeoutSeconds",
        "limit",
        "continue",
        "x",
        "wat ch",
        "Watch",
        "tags",
    ]
)
VALUES = st.sampled_from(
    [
        "true",
        "1",
        "t",
        "TRUE",
        "false",
        "0",
        "",
        "yes",
        "All",
        "metadata.name=app-config",
        "metadata.name==web,metadata.namespace=dev",
        "metadata.name!=x",
        "a in (x,y)",
        "acme",
        "beta",
        "\x00",
        "é",
        "+",
        " ",
        "a&b",
        "a=b",
        "a;watch=true",
        "#",
        "%",
        "%77",
    ]
)


@st.composite
def targets(draw: st.DrawFn) -> tuple[str, str]:
    method = draw(st.sampled_from(["GET", "GET", "GET", "HEAD", "DELETE"]))
    prefix = draw(st.sampled_from([["api", "v1"], ["apis", "compute", "v1"]]))
    watch_path = draw(st.sampled_from([[], [], ["watch"]]))
    scope = draw(
        st.sampled_from(
            [
                ["tenants", "acme", "namespaces", "dev"],
                ["namespaces", "dev"],
                ["tenants", "acme"],
                [],
            ]
        )
    )
    resource = [draw(st.sampled_from(["pods", "configmaps", "secrets", "servers", "nodes"]))]
    rest: list[str] = []
    if draw(st.booleans()):
        rest.append(draw(NAMES))
        if draw(st.booleans()):
            rest.append(draw(st.sampled_from(["tags", "status", "power"])))
            if draw(st.booleans()):
                rest.append(draw(NAMES))
    segments = [*prefix, *watch_path, *scope, *resource, *rest]
    path = "/" + "/".join([draw(spelled(seg)) for seg in segments])
    pairs = draw(st.lists(st.tuples(KEYS, VALUES), max_size=5))
    parts = []
    for key, value in pairs:
        k, v = draw(spelled(key, plus=True)), draw(spelled(value, plus=True))
        parts.append(
            draw(st.sampled_from([f"{k}={v}", f"{k}={v}", k if not value else f"{k}={v}"]))
        )
    separator = draw(st.sampled_from(["&", "&", ";"]))
    query = separator.join(parts)
    target = path + ("?" + query if query or draw(st.booleans()) else "")
    if draw(st.integers(0, 9)) == 0:  # a '#' somewhere
        at = draw(st.integers(0, len(target)))
        target = target[:at] + "#" + target[at:]
    return method, target


# -- the property -------------------------------------------------------------------

_counter = iter(range(10**9))


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(targets())
@example(
    (
        "GET",
        "/api/v1/tenants/acme/namespaces/dev/secrets?x=1#&fieldSelector=metadata.name%3Dapp-config",
    )
)
@example(("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps?resourceVersion=0&watch=true#"))
@example(("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps?%77atch=true"))
@example(("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps?watch=%2574rue"))
@example(("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps?watch=false&watch=true"))
@example(("GET", "/api/v1/namespaces/dev/configmaps?watch=1"))
@example(("GET", "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web/tags/a%2Fb"))
def test_the_upstream_reads_what_the_sidecar_decided(
    stack: tuple[processes.Proc, UpstreamReader], case: tuple[str, str]
) -> None:
    sidecar, reader = stack
    method, target = case
    request_id = f"diff-{next(_counter)}"
    status = send(sidecar.port, method, target, request_id)
    forwarded = reader.received.get(request_id, [])
    try:
        decided = parse_target(method, target).resolve_tenant(CALLER_TENANT)
    except TargetError:
        # Refused: a 4xx and nothing reached the upstream.
        assert 400 <= status < 500, (target, status)
        assert forwarded == [], (target, forwarded)
        return
    if not forwarded:
        assert 400 <= status < 500, (target, status)  # refused for another reason
        return
    assert len(forwarded) == 1, (target, forwarded)
    seen = forwarded[0]
    assert seen.reading is not None, (target, seen.raw_path, seen.error)
    assert seen.reading == reading_of(decided), (target, seen.raw_path)


def test_the_property_runs_against_the_live_sidecar(
    stack: tuple[processes.Proc, UpstreamReader],
) -> None:
    """The fixture forwards at all: a plain list reaches the upstream as decided."""
    sidecar, reader = stack
    assert send(sidecar.port, "GET", "/api/v1/namespaces/dev/pods?limit=1", "plain") == 200
    (seen,) = reader.received["plain"]
    assert seen.raw_path == "/api/v1/tenants/default/namespaces/dev/pods?limit=1"
    assert Path(ROOT).exists()

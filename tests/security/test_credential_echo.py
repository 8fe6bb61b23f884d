"""Long credentials and credential echo (DESIGN §8, §9).

Found by a hostile review: JWTs between 8 and 16 KiB passed the sidecar, and the store
(aiohttp with its default 8190-byte header field limit) refused them with a 400 whose
body quoted the token's start, which the sidecar passed on to the client. Now every
header the sidecar accepts (`limits.maxHeaderBytes`, a bearer token up to 16 KiB) is
one the reference store accepts too, so a valid long token works end to end; what the
sidecar refuses it refuses itself (401/431) without quoting the token; and an upstream
error answer that quotes the request's credential has it masked before it reaches
the client. Real sidecar and store processes, and an aiohttp upstream process that
echoes the credential."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.core.redact import MASK
from tests.rigs import processes
from tests.rigs.inprocess import write_policy
from tests.rigs.tokens import SECRET, claims, hs256

TENANT = {"token": "t-root", "user": "root", "tenant": "system", "groups": ["operators"]}
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def long_jwt(size: int, secret: str = SECRET) -> str:
    """A signed JWT of about `size` bytes for alice of acme (group `users`)."""
    body = claims("alice", "acme", ["users"], iss=None)
    token = hs256({**body, "pad": ""}, secret)
    pad = "p" * ((size - len(token)) * 3 // 4)
    return hs256({**body, "pad": pad}, secret)


def windows(token: str, width: int = 16) -> list[str]:
    """Every `width`-character piece of the token (a quoted part contains one)."""
    return [token[i : i + width] for i in range(0, len(token) - width + 1, width // 2)]


def assert_not_quoted(token: str, text: str) -> None:
    quoted = [piece for piece in windows(token) if piece in text]
    # The JWT's first segment (`{"alg":"HS256","typ":"JWT"}`) is the same for every
    # token and no secret; anything after it is.
    header = token.split(".", 1)[0]
    assert [piece for piece in quoted if piece not in header] == [], text[:300]


def config(store: processes.Proc, tmp: Path) -> dict[str, Any]:
    return {
        "upstream": store.url,
        "policies": str(write_policy(tmp)),
        "identity": {
            "tokenFile": str(processes.write_tokens(tmp, [TENANT])),
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "audience": "sidecar"},
        },
    }


async def send(url: str, token: str | None, path: str = CONFIGMAPS) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession(max_field_size=1 << 20) as session:
        async with session.get(url + path, headers=headers) as response:
            return response.status, await response.text()


async def send_raw(port: int, header_value: str) -> bytes:
    """One request over a raw socket (aiohttp's client refuses a header this long)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET {CONFIGMAPS} HTTP/1.1\r\nHost: x\r\nAuthorization: {header_value}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def test_long_tokens_through_the_real_processes(procs: processes.Processes, tmp_path: Path) -> None:
    store = procs.store()
    sidecar = procs.sidecar(config(store, tmp_path))

    async def run() -> None:
        status, body = await send(sidecar.url, "t-root", "/api/v1/tenants")
        assert status == 200, body
        async with aiohttp.ClientSession() as session:
            created = await session.post(
                sidecar.url + "/api/v1/tenants",
                json={"metadata": {"name": "acme"}},
                headers={"Authorization": "Bearer t-root"},
            )
            assert created.status == 201, await created.text()

        # A valid 12 KiB token: the store accepts what the sidecar forwards.
        valid = long_jwt(12 * 1024)
        assert 12 * 1024 - 200 < len(valid) < 16 * 1024
        status, body = await send(sidecar.url, valid)
        assert status == 200, body[:300]
        assert json.loads(body)["kind"] == "ConfigMapList"

        # The same size, signed with another key: the sidecar's own 401, unquoted.
        forged = long_jwt(12 * 1024, secret="another-secret-of-at-least-32-bytes!")
        status, body = await send(sidecar.url, forged)
        assert status == 401
        assert json.loads(body)["kind"] == "Status"
        assert_not_quoted(forged, body)

        # Over the token limit (16 KiB), over maxHeaderBytes (32 KiB), over aiohttp's
        # own line limit (64 KiB): refused by the sidecar, never quoted.
        for size, code in ((20 * 1024, 401), (40 * 1024, 431), (70 * 1024, 431)):
            token = long_jwt(size)
            raw = await send_raw(sidecar.port, f"Bearer {token}")
            head, _, payload = raw.partition(b"\r\n\r\n")
            assert head.split(b" ", 2)[1] == str(code).encode(), head
            assert json.loads(payload)["kind"] == "Status"
            assert_not_quoted(token, raw.decode("latin-1"))
            assert_not_quoted(token, sidecar.log())
            assert_not_quoted(token, store.log())

    asyncio.run(run())


# -- upstreams that quote the credential ----------------------------------------------

# An upstream that quotes the Authorization header in its error answers, served by
# aiohttp with its default limits (8190-byte header fields), as the store was: its own
# 400 for a longer header quotes the header's first bytes.
ECHOING_UPSTREAM = """
import sys
from aiohttp import web

async def handle(request):
    value = request.headers.get("Authorization", "")
    if request.path.endswith("/plain"):
        return web.Response(status=401, text=f"token {value[7:]} is not accepted here")
    body = {"kind": "Status", "status": "Failure", "code": 403, "message": f"bad {value!r}"}
    return web.json_response(body, status=403)

app = web.Application()
app.router.add_route("*", "/{tail:.*}", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def start_echoing_upstream(tmp: Path) -> processes.Proc:
    port = processes.free_port()
    log = tmp / "echoing-upstream.log"
    with open(log, "ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", ECHOING_UPSTREAM, str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = processes.Proc(child, port, log)
    processes.wait_http(f"{proc.url}/healthz", proc)
    return proc


def test_an_upstream_error_quoting_the_credential_is_masked(
    procs: processes.Processes, tmp_path: Path
) -> None:
    upstream = start_echoing_upstream(tmp_path)
    procs.started.append(upstream)
    sidecar = procs.sidecar(
        {
            "upstream": upstream.url,
            "policies": str(write_policy(tmp_path)),
            "identity": {"jwt": {"algorithms": ["HS256"], "secret": SECRET, "audience": "sidecar"}},
        }
    )

    async def run() -> None:
        short = long_jwt(600)
        status, body = await send(sidecar.url, short)
        assert status == 403
        assert_not_quoted(short, body)
        assert MASK in json.loads(body)["message"]
        status, body = await send(sidecar.url, short, CONFIGMAPS + "/plain")
        assert status == 401
        assert body == f"token {MASK} is not accepted here"

        # Longer than the upstream's header limit: its own 400 quotes the start.
        long = long_jwt(12 * 1024)
        status, body = await send(sidecar.url, long)
        assert status == 400
        assert "Got more than 8190 bytes" in body
        assert_not_quoted(long, body)

    asyncio.run(run())

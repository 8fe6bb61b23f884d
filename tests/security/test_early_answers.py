"""A read's answer goes out before the stages around the forwarding unwind (issue 32,
docs/performance.md): the client may have it while the rate limit has not yet freed the
in-flight slot. With `maxInFlight: 1`, a client that sends its next read the moment it
has the answer (on a new connection, or alternating between two) must never be refused
for a slot its own finished request still holds; pipelined reads of two tenants on one
connection get their own answers in order; a client that hangs up frees its slot.

Real store and sidecar processes on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from pathlib import Path

import aiohttp

from sidecar.cli.launch import ProcessGroup
from tests.rigs import processes
from tests.rigs.policies import admin_policy
from tests.rigs.waiting import eventually

POLICY = admin_policy(
    'configmaps: 100, servers: 100, requests.cpu: "1"',
    {"acme": "alice", "beta": "bob"},
    extra="""
---
kind: RateLimit
metadata: {name: default}
spec: {tenant: "*", rate: 100000, burst: 100000, maxInFlight: 1}
""",
)
TOKENS = [
    {"token": "admin-token", "user": "admin", "tenant": "system", "groups": []},
    {"token": "alice-token", "user": "alice", "tenant": "acme", "groups": []},
    {"token": "bob-token", "user": "bob", "tenant": "beta", "groups": []},
]
CM = "/api/v1/namespaces/ns1/configmaps"


def _head(target: str, token: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()


async def test_early_answers_hold_no_slot_and_keep_their_order(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(POLICY)
    with ProcessGroup() as started:
        store = started.add(processes.start_store(tmp_path))
        config = {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(processes.write_tokens(tmp_path, TOKENS))},
            "reload": {"enabled": False},
        }
        sidecar = started.add(processes.start_sidecar(tmp_path, config))
        url = sidecar.url
        port = int(url.rsplit(":", 1)[1])
        async with aiohttp.ClientSession() as http, aiohttp.ClientSession() as other:

            async def call(
                token: str, method: str, path: str, body: object = None, close: bool = False
            ) -> tuple[int, bytes]:
                headers = {"Authorization": f"Bearer {token}"}
                if close:
                    headers["Connection"] = "close"
                async with http.request(method, url + path, json=body, headers=headers) as r:
                    return r.status, await r.read()

            for tenant in ("acme", "beta"):
                status, _ = await call(
                    "admin-token", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
                )
                assert status == 201
                status, _ = await call(
                    "admin-token",
                    "POST",
                    f"/api/v1/tenants/{tenant}/namespaces",
                    {"metadata": {"name": "ns1"}},
                )
                assert status == 201
            mine = {"metadata": {"name": "a1"}, "data": {"k": "alice"}}
            theirs = {"metadata": {"name": "b1"}, "data": {"k": "bob"}}
            assert (await call("alice-token", "POST", CM, mine))[0] == 201
            assert (await call("bob-token", "POST", CM, theirs))[0] == 201

            # Next read sent the moment the answer is in: a new connection each time.
            seen = Counter([(await call("alice-token", "GET", f"{CM}/a1", close=True))[0]])
            for _ in range(99):
                seen[(await call("alice-token", "GET", f"{CM}/a1", close=True))[0]] += 1
            # ... and alternating between two keep-alive connections.
            for i in range(100):
                session = http if i % 2 else other
                async with session.get(
                    url + f"{CM}/a1", headers={"Authorization": "Bearer alice-token"}
                ) as resp:
                    await resp.read()
                    seen[resp.status] += 1
            assert seen == {200: 200}

            # Pipelined reads of two tenants on one connection: each its own answer.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                _head(f"{CM}/a1", "alice-token")
                + _head(f"{CM}/b1", "bob-token")
                + _head(f"{CM}/b1", "alice-token")
            )
            await writer.drain()
            data = b""
            while data.count(b"HTTP/1.1 ") < 3:
                chunk = await asyncio.wait_for(reader.read(65536), 10)
                assert chunk, data
                data += chunk
            writer.close()
            answers = data.split(b"HTTP/1.1 ")[1:]
            assert [a[:3] for a in answers] == [b"200", b"200", b"404"]
            assert b'"alice"' in answers[0]
            assert b'"bob"' not in answers[0]
            assert b'"bob"' in answers[1]
            assert b'"bob"' not in answers[2]

            # A client that hangs up right after its request frees the slot.
            loop = asyncio.get_running_loop()
            for _ in range(20):
                sock = socket.socket()
                sock.setblocking(False)
                await loop.sock_connect(sock, ("127.0.0.1", port))
                await loop.sock_sendall(sock, _head(f"{CM}/a1", "alice-token"))
                sock.close()
            statuses: list[int] = []

            async def read_ok() -> bool:
                statuses.append((await call("alice-token", "GET", f"{CM}/a1"))[0])
                return statuses[-1] == 200

            await eventually(read_ok, 10)

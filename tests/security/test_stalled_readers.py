"""Clients that stop reading (issue 28, item 3; DESIGN §6, §8): every write to a client
has a deadline, `limits.clientWriteTimeout`. A client that reads nothing of its answer
for that long loses its connection, and its upstream connection and in-flight slot are
released. Found by a hostile review: 64 stalled readers of an owner-filtered list held
64 store connections (the read deadline was cleared before writing to the client) and
locked their tenant's other users out with 429s.

The real sidecar and the real backing store as processes, a recording relay between
them (tests/rigs/relay.py) that tells which upstream connections are still open. The
stalled readers are raw sockets that send a request and never read; they announce a
small segment size and receive buffer, so the kernel takes little of the answer for
them and the sidecar's writes block after about 128 KiB (not after the megabytes a
loopback socket would otherwise absorb), with answers of 2 MiB.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.rigs import processes
from tests.rigs.relay import RecordingRelay
from tests.rigs.waiting import eventually

POLICY = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
- {nonResourceURLs: ["*"], verbs: ["*"]}
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: admin}]
---
kind: ClusterRole
metadata: {name: node-owner}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get, list], when: owner}
---
kind: TenantRoleBinding
metadata: {name: node-owners, tenant: acme}
roleRef: {kind: ClusterRole, name: node-owner}
subjects: [{kind: Group, name: members}]
---
kind: RateLimit
metadata: {name: default}
spec: {tenant: "*", rate: 100000, burst: 100000, maxInFlight: 64}
"""
TOKENS = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "alice", "user": "alice", "tenant": "acme", "groups": ["members"]},
]
READERS = 64  # the tenant's maxInFlight: every slot held by a reader that stopped
NODES = 32
PAD = 64 * 1024  # 32 nodes of 64 KiB: a 2 MiB list, past the filter's 1 MiB hold
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
# The deadline in the test, and a hang guard far above it.
WRITE_TIMEOUT = 1.0
RELEASED_WITHIN = 15.0


@dataclass
class Rig:
    url: str
    port: int
    relay: RecordingRelay
    http: aiohttp.ClientSession
    readers: list[socket.socket] = field(default_factory=list)

    async def stall(self, token: str, target: str, accept: str = "application/json") -> None:
        """Send a GET over a raw connection that never reads a byte of the answer."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Little room on the reader's side: the sidecar's writes block early.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        sock.setblocking(False)
        self.readers.append(sock)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", self.port))
        head = (
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {token}\r\nAccept: {accept}\r\n\r\n"
        )
        await loop.sock_sendall(sock, head.encode())

    def held(self, marker: bytes) -> int:
        """Upstream connections still open that carried `marker`."""
        return sum(1 for link in self.relay.open_links() if link.carried(marker))

    async def status(self, token: str, target: str) -> int:
        """The status of a GET read to its end (a cut answer counts as 0)."""
        try:
            async with self.http.get(
                self.url + target, headers={"Authorization": f"Bearer {token}"}
            ) as resp:
                await resp.read()
                return resp.status
        except aiohttp.ClientPayloadError:
            return 0

    def close_readers(self) -> None:
        for sock in self.readers:
            sock.close()
        self.readers.clear()


async def _seed(store_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for tenant in ("acme",):
            async with http.post(
                f"{store_url}/api/v1/tenants", json={"metadata": {"name": tenant}}
            ) as resp:
                assert resp.status == 201, await resp.text()
        pad = "x" * PAD
        for i in range(NODES):
            node = {
                "metadata": {"name": f"node-{i:03d}", "annotations": {"pad": pad}},
                "spec": {"owner": "acme", "resource_class": "baremetal"},
            }
            async with http.post(f"{store_url}/api/v1/nodes", json=node) as resp:
                assert resp.status == 201, await resp.text()


@asynccontextmanager
async def rig(tmp: Path) -> AsyncIterator[Rig]:
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(POLICY)
    store = await asyncio.to_thread(processes.start_store, tmp)
    relay = RecordingRelay(store.port)
    try:
        await _seed(store.url)
        await relay.start()
        config = {
            "upstream": relay.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(processes.write_tokens(tmp, TOKENS))},
            "reload": {"enabled": False},
            # The upstream read deadline is far off: what ends the exchanges is the
            # client write deadline.
            "limits": {
                "clientWriteTimeout": WRITE_TIMEOUT,
                "upstreamReadTimeout": 60,
                "shutdownGraceSeconds": 1,
            },
        }
        sidecar = await asyncio.to_thread(processes.start_sidecar, tmp, config)
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=30),
            ) as http:
                r = Rig(sidecar.url, sidecar.port, relay, http)
                try:
                    yield r
                finally:
                    r.close_readers()
        finally:
            await asyncio.to_thread(sidecar.stop)
    finally:
        await relay.stop()
        await asyncio.to_thread(store.stop)


async def test_stalled_readers_of_owner_filtered_lists_release_connections_and_slots(
    tmp_path: Path,
) -> None:
    """64 readers of a 2 MiB owner-filtered list that stop reading take every in-flight
    slot of their tenant; the write deadline cuts them, their upstream connections close
    and the tenant is served again (before the fix: held until the readers hang up)."""
    async with rig(tmp_path) as r:
        marker = b"owner=acme"
        for _ in range(READERS):
            await r.stall("alice", "/api/v1/nodes")
        await eventually(
            lambda: r.relay.requests_with(marker) >= READERS,
            RELEASED_WITHIN,
            what="every stalled list reached the upstream (each holding a slot)",
        )

        async def released() -> bool:
            # An answer read to its end is pooled (its link stays open): look at the
            # links first, then ask.
            return r.held(marker) == 0 and await r.status("alice", "/api/v1/nodes") == 200

        await eventually(
            released,
            RELEASED_WITHIN,
            what="the stalled lists' upstream connections closed and their slots came back",
        )
        for sock in r.readers:
            assert await _cut(sock), "a stalled reader still has its connection"


async def test_stalled_reader_of_a_streamed_answer_is_cut(tmp_path: Path) -> None:
    """A plain proxied stream (the admin's unfiltered 2 MiB list, streamed back as the
    upstream sends it): its reader stops, the write deadline cuts it and its upstream
    connection closes."""
    async with rig(tmp_path) as r:
        marker = b"limit=1000"
        await r.stall("admin", "/api/v1/nodes?limit=1000")
        await eventually(
            lambda: r.relay.requests_with(marker) == 1, RELEASED_WITHIN, what="forwarded"
        )
        await eventually(
            lambda: r.held(marker) == 0,
            RELEASED_WITHIN,
            what="the stalled stream's upstream connection closed",
        )
        assert await _cut(r.readers[0])


async def test_stalled_reader_of_a_table_is_cut(tmp_path: Path) -> None:
    """An owner-filtered Table whose rows carry the whole objects (2 MiB): its reader
    stops, the write deadline cuts it and its upstream connection closes."""
    async with rig(tmp_path) as r:
        target = "/api/v1/nodes?includeObject=Object"
        marker = b"includeObject=Object"
        async with r.http.get(
            r.url + target, headers={"Authorization": "Bearer alice", "Accept": TABLE}
        ) as resp:
            table = await resp.read()
        assert resp.status == 200, table[:200]
        assert json.loads(table)["kind"] == "Table"
        assert len(table) > NODES * PAD  # big: it streams through the filter
        read = r.relay.requests_with(marker)
        await r.stall("alice", target, accept=TABLE)
        await eventually(
            lambda: r.relay.requests_with(marker) == read + 1, RELEASED_WITHIN, what="forwarded"
        )
        # The Table read above left its connection pooled (open); the stalled one is
        # the other link that carried the marker.
        await eventually(
            lambda: not _open_stalled(r, marker),
            RELEASED_WITHIN,
            what="the stalled Table's upstream connection closed",
        )
        assert await _cut(r.readers[0])


def _open_stalled(r: Rig, marker: bytes) -> bool:
    """Whether the last link that carried `marker` (the stalled request's) is open."""
    links = [link for link in r.relay.links if link.carried(marker)]
    return bool(links) and not links[-1].closed


async def _cut(sock: socket.socket) -> bool:
    """Whether the sidecar cut this connection: reading what is left ends with a reset
    or an end of stream, never with a complete chunked answer."""
    loop = asyncio.get_running_loop()
    received = b""
    try:
        async with asyncio.timeout(RELEASED_WITHIN):  # hang guard
            while chunk := await loop.sock_recv(sock, 65536):
                received = (received + chunk)[-16:]
    except ConnectionResetError:
        return True
    return not received.endswith(b"0\r\n\r\n")

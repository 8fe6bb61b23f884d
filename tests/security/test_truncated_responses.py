"""Truncated upstream answers (issue 12 finding 8, DESIGN §8): an answer the sidecar
must read (owner-filtered lists, create answers the quota stage records, its own
lookups) is read completely; one cut short is a 502 and releases the quota
reservation. Real sidecar process with the shipped policies, raw upstream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.rigs import paths, processes
from tests.rigs.raw_http import ALICE_TOKEN, Message, RawUpstream, sidecar_config

ROOT = paths.ROOT
ALICE = {"Authorization": f"Bearer {ALICE_TOKEN}"}
SERVERS = "/apis/compute/v1/tenants/acme/namespaces/default/servers"


def _node_list(count: int) -> bytes:
    items = [
        {
            "metadata": {"name": f"node-{i}"},
            "spec": {"owner": "acme" if i % 3 == 0 else "beta", "pad": "p" * 80},
        }
        for i in range(count)
    ]
    return json.dumps(
        {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items}
    ).encode()


NODES = _node_list(5000)  # about 700 KB
ACME_NODES = sum(1 for i in range(5000) if i % 3 == 0)


async def _send_in_pieces(
    writer: asyncio.StreamWriter, head: bytes, body: bytes, pieces: int = 25
) -> None:
    writer.write(head)
    step = max(1, len(body) // pieces)
    for start in range(0, len(body), step):
        writer.write(body[start : start + step])
        await writer.drain()
        # the behaviour under test: separate TCP segments, the reader sees partial buffers
        await asyncio.sleep(0.005)


def _head(status: int, length: int) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


class Scripted:
    """Answers by path: whole node lists in pieces, or answers cut short."""

    def __init__(self) -> None:
        self.cut = False

    async def __call__(self, msg: Message, writer: asyncio.StreamWriter) -> bool:
        path = msg.target.partition("?")[0]
        if path == "/api/v1/nodes":
            if self.cut:  # promises 700 KB, sends 300 KB, closes
                await _send_in_pieces(writer, _head(200, len(NODES)), NODES[:300_000])
                return False
            await _send_in_pieces(writer, _head(200, len(NODES)), NODES)
            return True
        if path.startswith("/api/v1/nodes/"):  # the sidecar's owner lookup, cut short
            body = json.dumps(
                {"metadata": {"name": "n"}, "spec": {"owner": "acme"}, "pad": "q" * 50_000}
            ).encode()
            await _send_in_pieces(writer, _head(200, len(body)), body[:20_000])
            return False
        if msg.method == "POST" and path == SERVERS:  # a create answer, cut short
            body = json.dumps({"metadata": {"name": "web-1"}, "pad": "r" * 1_000_000}).encode()
            await _send_in_pieces(writer, _head(201, len(body)), body[:100_000])
            return False
        writer.write(_head(200, 2) + b"{}")
        await writer.drain()
        return True


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Scripted, RawUpstream, processes.Proc]]:
    script = Scripted()
    upstream = RawUpstream(responder=script).start()
    proc = processes.start_sidecar(
        tmp_path,
        sidecar_config(
            tmp_path,
            upstream.url,
            policies=str(ROOT / "policies"),
            limits={"upstreamReadTimeout": 10},
        ),
    )
    yield script, upstream, proc
    proc.stop()
    upstream.stop()


async def test_owner_filtered_list_arriving_in_pieces_is_read_whole(
    stack: tuple[Scripted, RawUpstream, processes.Proc],
) -> None:
    _, _, proc = stack
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{proc.url}/api/v1/nodes", headers=ALICE) as r:
            assert r.status == 200
            body = await r.json()
    names = [i["metadata"]["name"] for i in body["items"]]
    assert len(names) == ACME_NODES
    assert all(i["spec"]["owner"] == "acme" for i in body["items"])


async def test_owner_filtered_list_cut_short_is_502(
    stack: tuple[Scripted, RawUpstream, processes.Proc],
) -> None:
    script, _, proc = stack
    script.cut = True
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{proc.url}/api/v1/nodes", headers=ALICE) as r:
            assert r.status == 502
            body = await r.json()
            assert body["kind"] == "Status"
            assert body["code"] == 502
        script.cut = False
        async with s.get(f"{proc.url}/api/v1/nodes", headers=ALICE) as r:
            assert r.status == 200
            assert len((await r.json())["items"]) == ACME_NODES


async def test_owner_lookup_cut_short_is_502(
    stack: tuple[Scripted, RawUpstream, processes.Proc],
) -> None:
    _, _, proc = stack
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{proc.url}/api/v1/nodes/node-0", headers=ALICE) as r:
            # The owner check turns any failed lookup into 503 (no decision without
            # the owner); the lookup itself saw the cut, not an unreachable upstream.
            assert r.status == 503
            body = await r.json()
            assert body["kind"] == "Status"
            assert "cut short" in body["message"]


async def _servers_row(s: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with s.get(f"{base}/quota/v1/tenants/acme", headers=ALICE) as r:
        assert r.status == 200, await r.text()
        rows = (await r.json())["quotas"]
    return next(row for row in rows if row["resource"] == "servers")


async def test_create_answer_cut_short_is_502_and_releases_the_reservation(
    stack: tuple[Scripted, RawUpstream, processes.Proc],
) -> None:
    _, upstream, proc = stack
    create = {"metadata": {"name": "web-1"}, "spec": {"flavor": "m1.small"}}
    async with aiohttp.ClientSession() as s:
        before = await _servers_row(s, proc.url)
        async with s.post(f"{proc.url}{SERVERS}", json=create, headers=ALICE) as r:
            assert r.status == 502, await r.text()
            body = await r.json()
            assert body["kind"] == "Status"
            assert body["code"] == 502
        assert any(m.method == "POST" for m in upstream.snapshot()[0])
        after = await _servers_row(s, proc.url)
    assert after["used"] == before["used"]
    assert after["in_progress"] == before["in_progress"] == 0

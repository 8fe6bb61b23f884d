"""Truncated upstream answers (issue 12 finding 8, DESIGN §8): an answer the sidecar
must read (owner-filtered lists, create answers the quota stage records, its own
lookups) is read completely; one cut short is a 502, and a create's reservation is
then settled against the store (DESIGN §7: charged when the store has the object,
released when not), never committed from the partial answer. Real sidecar process
with the shipped policies, raw upstream.

Owner-filtered lists stream (issue 24, DESIGN §8): one whose filtered answer fits in
what the sidecar holds before it starts answering (1 MiB) is still a 502 when cut
short, invalid or oversized; a longer one has started when the cut comes, and the
client then gets a broken answer (the connection ends without the last chunk), never a
clean-looking partial list (docs/security.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.rigs import paths, processes
from tests.rigs.raw_http import ALICE_TOKEN, Message, RawUpstream, sidecar_config
from tests.rigs.waiting import eventually

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


BIG_NODES = _node_list(45_000)  # about 7 MB, 2.3 MB of it acme's: more than is held
CUT = len(BIG_NODES) * 3 // 4  # past the first 1 MiB the sidecar answers


def _chunked_head() -> bytes:
    return b"HTTP/1.1 200 X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _send_chunks(writer: asyncio.StreamWriter, body: bytes, pieces: int = 25) -> None:
    step = max(1, len(body) // pieces)
    for start in range(0, len(body), step):
        piece = body[start : start + step]
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()


Answer = Callable[[asyncio.StreamWriter], Awaitable[bool]]


class Scripted:
    """Answers by path: whole node lists in pieces, or answers cut short; `nodes`, when
    set, answers the node list instead."""

    def __init__(self) -> None:
        self.cut = False
        self.nodes: Answer | None = None

    async def __call__(self, msg: Message, writer: asyncio.StreamWriter) -> bool:
        path = msg.target.partition("?")[0]
        if path == "/api/v1/nodes" and self.nodes is not None:
            return await self.nodes(writer)
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
        if msg.method == "GET" and path == SERVERS + "/web-1":  # it was made
            body = json.dumps({"metadata": {"name": "web-1"}}).encode()
            writer.write(_head(200, len(body)) + body)
            await writer.drain()
            return True
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


async def test_create_answer_cut_short_is_502_and_settled_against_the_store(
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
        assert before["in_progress"] == 0

        async def settled() -> dict[str, Any] | None:
            row = await _servers_row(s, proc.url)
            return row if row["in_progress"] == 0 else None

        # The store has it (its GET says so): charged once, from the store's object.
        after = await eventually(settled, what="the reservation is settled")
    assert after["used"] == before["used"] + 1


# -- owner-filtered lists that stream -------------------------------------------------


async def _broken_answer(proc: processes.Proc) -> None:
    """The client's view of a streamed list cut mid-way: a 200 whose body never ends
    cleanly, so no client takes it for a whole (shorter) list."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{proc.url}/api/v1/nodes", headers=ALICE) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()


async def _whole_list_afterwards(script: Scripted, proc: processes.Proc) -> None:
    script.nodes = None
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{proc.url}/api/v1/nodes", headers=ALICE) as r:
            assert r.status == 200
            assert len((await r.json())["items"]) == ACME_NODES


async def test_a_long_list_cut_after_it_started_is_a_broken_answer(
    stack: tuple[Scripted, RawUpstream, processes.Proc],
) -> None:
    script, _, proc = stack

    async def cut(writer: asyncio.StreamWriter) -> bool:  # promises 7 MB, sends 5 MB
        await _send_in_pieces(writer, _head(200, len(BIG_NODES)), BIG_NODES[:CUT])
        return False

    script.nodes = cut
    await _broken_answer(proc)
    await _whole_list_afterwards(script, proc)


async def test_a_long_chunked_list_without_its_last_chunk_is_a_broken_answer(
    stack: tuple[Scripted, RawUpstream, processes.Proc],
) -> None:
    script, _, proc = stack

    async def cut(writer: asyncio.StreamWriter) -> bool:
        writer.write(_chunked_head())
        await _send_chunks(writer, BIG_NODES[:CUT])
        return False

    script.nodes = cut
    await _broken_answer(proc)


async def test_a_long_list_that_turns_invalid_is_a_broken_answer(
    stack: tuple[Scripted, RawUpstream, processes.Proc],
) -> None:
    """Complete framing, but the JSON breaks after the answer started."""
    script, _, proc = stack
    body = BIG_NODES[:CUT] + b"\x00" + BIG_NODES[CUT:]  # invalid in and out of strings

    async def invalid(writer: asyncio.StreamWriter) -> bool:
        await _send_in_pieces(writer, _head(200, len(body)), body)
        return True

    script.nodes = invalid
    await _broken_answer(proc)
    await _whole_list_afterwards(script, proc)


@pytest.mark.parametrize(
    "body",
    [
        NODES[:-2] + b"x]}",  # invalid JSON near the end of a list that fits
        NODES + b" {}",  # a second document after the list
        json.dumps(  # one item larger than the sidecar reads (6 MiB by default)
            {"kind": "NodeList", "items": [{"spec": {"owner": "beta"}, "pad": "z" * 7_000_000}]}
        ).encode(),
    ],
    ids=["invalid", "trailing", "item-too-large"],
)
async def test_a_list_that_fits_and_is_broken_is_502(
    stack: tuple[Scripted, RawUpstream, processes.Proc], body: bytes
) -> None:
    script, _, proc = stack

    async def broken(writer: asyncio.StreamWriter) -> bool:
        writer.write(_chunked_head())
        await _send_chunks(writer, body)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    script.nodes = broken
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{proc.url}/api/v1/nodes", headers=ALICE) as r:
            assert r.status == 502, await r.text()
            answer = await r.json()
            assert answer["kind"] == "Status"
            assert answer["code"] == 502
            # The refusal does not quote the answer it refused.
            assert "node-" not in answer["message"]
            assert "owner" not in answer["message"]
    await _whole_list_afterwards(script, proc)

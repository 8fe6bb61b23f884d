"""Decompression bombs (issue 12 finding 2, DESIGN §8): the sidecar never decompresses
a request body, so a small gzip body that inflates to gigabytes costs it nothing,
whether it refuses the request (401, the body never read) or forwards it (the
compressed bytes as sent). Meanwhile another client's requests are answered promptly.
Real sidecar process, raw upstream."""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.rigs import processes
from tests.rigs.raw_http import (
    ADMIN_TOKEN,
    RawUpstream,
    exchange,
    request_bytes,
    sidecar_config,
)

EVENT = "/api/v1/tenants/acme/namespaces/dev/events/e1"
INFLATED_MIB = 2048  # 2 GiB of zeros


def _gzip_bomb() -> bytes:
    """A valid gzip of INFLATED_MIB MiB of zeros (about 2 MB), built from one
    compressed MiB repeated: a full flush makes every MiB compress the same."""
    mib = bytes(1 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = comp.compress(mib) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(mib) + comp.flush(zlib.Z_FULL_FLUSH)
    assert comp.compress(mib) + comp.flush(zlib.Z_FULL_FLUSH) == again
    last = comp.flush(zlib.Z_FINISH)
    crc = 0
    for _ in range(INFLATED_MIB):
        crc = zlib.crc32(mib, crc)
    size = (INFLATED_MIB << 20) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = crc.to_bytes(4, "little") + size.to_bytes(4, "little")
    return header + first + again * (INFLATED_MIB - 1) + last + trailer


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = _gzip_bomb()
    assert len(data) >= 2_000_000
    return data


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[RawUpstream, processes.Proc]]:
    upstream = RawUpstream().start()
    proc = processes.start_sidecar(tmp_path, sidecar_config(tmp_path, upstream.url))
    yield upstream, proc
    proc.stop()
    upstream.stop()


async def _worst_latency_during(base: str, attack: asyncio.Task[object]) -> float:
    """Another client's simple requests, one after the other, until the attack is
    answered and a little after: the slowest answer's time."""
    worst = 0.0
    after: float | None = None
    async with aiohttp.ClientSession() as s:
        while after is None or time.monotonic() < after:
            started = time.monotonic()
            async with s.get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(total=30)) as r:
                assert r.status == 200
            worst = max(worst, time.monotonic() - started)
            if attack.done() and after is None:
                after = time.monotonic() + 0.5
            await asyncio.sleep(0.02)  # the behaviour under test: a client probing steadily
    return worst


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("authenticated", [False, True], ids=["anonymous", "authenticated"])
async def test_gzip_bomb_does_not_stall_other_clients(
    authenticated: bool,
    bomb: bytes,
    stack: tuple[RawUpstream, processes.Proc],
) -> None:
    upstream, proc = stack
    headers = [("Content-Type", "application/json"), ("Content-Encoding", "gzip")]
    if authenticated:
        headers.append(("Authorization", f"Bearer {ADMIN_TOKEN}"))
    raw = request_bytes("PUT", EVENT, headers, bomb)
    cpu_before = _cpu_seconds(proc.pid)
    attack = asyncio.ensure_future(exchange(proc.port, raw, 1, wait=30))
    worst = await _worst_latency_during(proc.url, attack)
    answers, _ = await attack
    cpu = _cpu_seconds(proc.pid) - cpu_before
    assert [a.status for a in answers] == [200 if authenticated else 401]
    assert worst < 1.0, f"another client waited {worst:.2f} s during the bomb"
    # Inflating 2 GiB takes about a second of CPU or more; relaying 2 MB, milliseconds.
    assert cpu < 0.5, f"the sidecar spent {cpu:.2f} s of CPU on a 2 MB body"
    received, errors = upstream.snapshot()
    assert errors == []
    if authenticated:
        assert len(received) == 1
        assert received[0].body == bomb  # forwarded compressed, byte for byte
    else:
        assert received == []

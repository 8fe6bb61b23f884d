"""`/metrics` with `sidecar serve --workers 2` covers every worker (DESIGN §9).

The real sidecar forks two workers sharing the port; requests go out on fresh
connections until both workers have served some (read from each worker's own
multiprocess file, in the per-run directory the sidecar creates under `TMPDIR`), and
the request counter scraped from either listener (`metricsListen` without
credentials, the main one with a `/metrics` grant) equals the number sent. The
directory is removed when the sidecar exits.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.rigs import processes
from tests.rigs.stack import ADMIN, ALICE, running_env

REQUESTS = "sidecar_requests_total"


def requests_in(text: str) -> float:
    """The sum of `sidecar_requests_total` over all its label sets."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == REQUESTS
    )


def per_worker(tmp: Path) -> dict[int, float]:
    """Requests counted by each worker process, from its own multiprocess file."""
    counts: dict[int, float] = {}
    for path in tmp.glob("sidecar-metrics-*/counter_*.db"):
        pid = int(path.stem.split("_")[1])
        counts[pid] = sum(
            sample.value
            # prometheus_client leaves merge() unannotated
            for family in MultiProcessCollector.merge([str(path)])  # type: ignore[no-untyped-call]
            for sample in family.samples
            if sample.name == REQUESTS
        )
    return counts


async def scrape(url: str, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/metrics", headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.text()


async def one_request(url: str) -> None:
    # A connection of its own, so SO_REUSEPORT spreads requests over the workers.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with http.get(f"{url}/api/v1/namespaces/ns1/configmaps", headers=headers) as resp:
            assert resp.status == 200, await resp.text()


async def test_metrics_cover_all_workers(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    scrape_port = processes.free_port()
    scrape_url = f"http://127.0.0.1:{scrape_port}"
    async with running_env(
        tmp_path,
        limit=5,
        env={"TMPDIR": str(tmpdir)},
        workers=2,
        metricsListen=f"127.0.0.1:{scrape_port}",
    ) as env:
        assert list(tmpdir.glob("sidecar-metrics-*")), "no per-run metrics directory"
        before = requests_in(await scrape(scrape_url))
        sent = 0
        deadline = time.monotonic() + 30
        while True:
            await asyncio.gather(*(one_request(env.url) for _ in range(10)))
            sent += 10
            served = [n for n in per_worker(tmpdir).values() if n > 0]
            if len(served) >= 2:
                break
            assert time.monotonic() < deadline, (
                f"one worker served everything: {per_worker(tmpdir)}"
            )
        assert len(served) == 2, per_worker(tmpdir)

        total = requests_in(await scrape(scrape_url))
        assert total - before == sent
        assert sum(per_worker(tmpdir).values()) == total
        # The main listener (credentials and a /metrics grant) shows the same sum; its
        # own request is counted after it has answered.
        assert requests_in(await scrape(env.url, ADMIN)) == total
        env.sidecar.stop()
        assert env.sidecar.proc.returncode == 0, env.sidecar.log()
        assert not list(tmpdir.glob("sidecar-metrics-*")), "metrics directory left behind"

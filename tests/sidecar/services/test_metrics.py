"""`/metrics` with `sidecar serve --workers 2` covers every worker (DESIGN §9), and the
request path's tallies (`Metrics.child`) show what direct prometheus updates would.

The real sidecar forks two workers sharing the port; requests go out on fresh
connections until both workers have served some (read from each worker's own
multiprocess file, in the per-run directory the sidecar creates under `TMPDIR`), and
the request counter scraped from either listener (`metricsListen` without
credentials, the main one with a `/metrics` grant) equals the number sent as soon as
the answers have arrived (a worker hands its tallies over when it has nothing left in
flight; the answering worker flushes its own before every scrape). The directory is
removed when the sidecar exits.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from sidecar.services.metrics import Metrics
from tests.rigs.stack import ADMIN, ALICE, running_env

REQUESTS = "sidecar_requests_total"
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


def requests_in(text: str) -> float:
    """The sum of `sidecar_requests_total` over its `list` label sets: the test's own
    requests (the rig's seeding creates and the scrapes are other verbs)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == REQUESTS and sample.labels.get("verb") == "list"
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
            if sample.name == REQUESTS and sample.labels.get("verb") == "list"
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
    async with running_env(
        tmp_path, limit=5, env={"TMPDIR": str(tmpdir)}, workers=2, metrics=True
    ) as env:
        scrape_url = f"http://127.0.0.1:{env.sidecar.extra['metrics_port']}"
        assert list(tmpdir.glob("sidecar-metrics-*")), "no per-run metrics directory"
        before = requests_in(await scrape(scrape_url))
        assert before == 0
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

        # Each worker hands its counts over when its last request in flight ends, so
        # the answers having arrived, the scrape counts every one of them.
        total = requests_in(await scrape(scrape_url))
        assert total - before == sent
        assert sum(per_worker(tmpdir).values()) == total
        # The main listener (credentials and a /metrics grant) shows the same sum; its
        # own request is counted after it has answered.
        assert requests_in(await scrape(env.url, ADMIN)) == total
        env.sidecar.stop()
        assert env.sidecar.proc.returncode == 0, env.sidecar.log()
        assert not list(tmpdir.glob("sidecar-metrics-*")), "metrics directory left behind"


@given(
    st.lists(
        st.one_of(
            st.floats(min_value=0, max_value=20, allow_nan=False),
            st.sampled_from([0.0005, 0.001, 0.0025, 0.01, 0.5, 10.0]),  # on a bound
        ),
        max_size=40,
    ),
    st.lists(st.sampled_from(["acme", "beta"]), min_size=1, max_size=40),
)
def test_tallies_flush_to_what_direct_updates_give(values: list[float], tenants: list[str]) -> None:
    """The request path's tallies, flushed, show exactly what prometheus-client's own
    `inc`/`observe` on every request would show, bucket by bucket (`le` bounds
    included), and nothing before the flush has been asked for."""
    metrics = Metrics()
    direct = CollectorRegistry()
    latency = Histogram("d_seconds", "", ["tenant"], buckets=BUCKETS, registry=direct)
    requests = Counter("d_requests", "", ["tenant"], registry=direct)
    for value, tenant in zip(values, tenants * len(values), strict=False):
        metrics.child(metrics.latency, tenant).observe(value)
        metrics.child(metrics.requests, tenant, "get", "allow", "200").inc()
        latency.labels(tenant).observe(value)
        requests.labels(tenant).inc()
    # A scrape (any collection of the registry) flushes first.
    for tenant in ("acme", "beta"):
        for bound in (*BUCKETS, float("inf")):
            le = floatToGoString(bound)  # type: ignore[no-untyped-call]
            got = metrics.registry.get_sample_value(
                "sidecar_request_duration_seconds_bucket", {"tenant": tenant, "le": le}
            )
            want = direct.get_sample_value("d_seconds_bucket", {"tenant": tenant, "le": le})
            assert got == want, (tenant, le)
        got_sum = metrics.registry.get_sample_value(
            "sidecar_request_duration_seconds_sum", {"tenant": tenant}
        )
        want_sum = direct.get_sample_value("d_seconds_sum", {"tenant": tenant})
        assert got_sum == pytest.approx(want_sum) if want_sum is not None else got_sum is None
        got_n = metrics.registry.get_sample_value(
            "sidecar_requests_total",
            {"tenant": tenant, "verb": "get", "decision": "allow", "code": "200"},
        )
        assert got_n == direct.get_sample_value("d_requests_total", {"tenant": tenant})


def test_in_flight_is_shown_at_each_scrape() -> None:
    metrics = Metrics()
    metrics.in_flight_now = 3
    assert metrics.registry.get_sample_value("sidecar_requests_in_flight") == 3
    metrics.in_flight_now = 0
    assert metrics.registry.get_sample_value("sidecar_requests_in_flight") == 0


def test_a_tally_keeps_counting_across_flushes() -> None:
    metrics = Metrics()
    tally = metrics.child(metrics.decision_cache, "hit")
    for rounds in range(1, 4):
        tally.inc()
        tally.inc(2)
        metrics.flush()
        value = metrics.registry.get_sample_value("sidecar_decision_cache_total", {"result": "hit"})
        assert value == 3 * rounds

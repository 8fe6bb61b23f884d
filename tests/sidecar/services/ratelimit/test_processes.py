"""Real sidecar processes against the real Redis: two replicas share one global limit,
and a global tier that goes away (a TCP forwarder this test owns and cuts, never the
shared Redis server) falls back to the local tier without errors; unauthenticated
requests are limited per client address while authenticated ones from it are not."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.rigs import processes
from tests.rigs.forwarder import Forwarder

POLICY = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["*"]
- nonResourceURLs: ["*"]
  verbs: ["*"]
---
kind: ClusterRoleBinding
metadata: {name: acme-everything}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: everything}
subjects:
- {kind: User, name: alice, tenant: acme}
---
kind: RateLimit
metadata: {name: acme}
spec: {tenant: acme, rate: 5, burst: 5}
"""
PATH = "/api/v1/tenants/acme/namespaces/default/configmaps"
HEADERS = {"Authorization": "Bearer tok-alice"}


def sidecar_config(tmp: Path, upstream: str, global_url: str, prefix: str) -> dict[str, Any]:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(POLICY)
    tokens = processes.write_tokens(
        tmp, [{"token": "tok-alice", "user": "alice", "tenant": "acme", "groups": []}]
    )
    return {
        "upstream": upstream,
        "policies": str(policies),
        "identity": {"tokenFile": str(tokens)},
        "rateLimit": {"global": global_url, "globalPrefix": prefix},
        "reload": {"enabled": False},
    }


async def hammer(
    http: aiohttp.ClientSession, urls: list[str], seconds: float
) -> tuple[dict[int, int], float]:
    """Requests from every url in turn (4 at a time each) for `seconds`."""
    counts: dict[int, int] = {}
    start = time.monotonic()

    async def worker(url: str) -> None:
        while time.monotonic() - start < seconds:
            async with http.get(url + PATH, headers=HEADERS) as resp:
                await resp.read()
                counts[resp.status] = counts.get(resp.status, 0) + 1
                if resp.status == 429:
                    assert int(resp.headers["Retry-After"]) >= 1
                assert resp.headers["RateLimit-Limit"] == "5"
            await asyncio.sleep(0.005)  # the behaviour under test: a steady request rate

    await asyncio.gather(*(worker(u) for u in urls for _ in range(4)))
    return counts, time.monotonic() - start


@pytest.mark.redis
async def test_two_sidecars_share_one_global_limit(
    tmp_path: Path, store: processes.Proc, redis_url: str, redis_prefix: str
) -> None:
    config = sidecar_config(tmp_path, store.url, redis_url, redis_prefix)
    # /metrics without credentials on its own address (alice's bucket is spent).
    a = processes.start_sidecar(tmp_path, config, name="a", metrics=True)
    scrape = f"127.0.0.1:{a.extra['metrics_port']}"
    b = processes.start_sidecar(tmp_path, config, name="b")
    try:
        async with aiohttp.ClientSession() as http:
            counts, elapsed = await hammer(http, [a.url, b.url], 2.0)
            metrics = await (await http.get(f"http://{scrape}/metrics")).text()
        limited = counts.get(429, 0)
        admitted = sum(n for code, n in counts.items() if code != 429)
        print(f"\ntwo replicas, global 5/s burst 5: {counts} in {elapsed:.2f}s")
        assert all(code < 500 for code in counts), counts
        assert limited > 0
        # Each replica alone would admit 5 + 5/s; together they stay within one limit.
        assert 5 <= admitted <= 5 * elapsed + 5, (counts, elapsed)
        assert 'tier="global"' in metrics
    finally:
        a.stop()
        b.stop()


@pytest.mark.redis
async def test_redis_going_away_falls_back_to_local_tier(
    tmp_path: Path, store: processes.Proc, redis_url: str, redis_prefix: str
) -> None:
    proxy = Forwarder(redis_url)
    await proxy.start()
    config = sidecar_config(tmp_path, store.url, proxy.url, redis_prefix)
    config["rateLimit"]["failOpenLogInterval"] = 3600
    sidecar = processes.start_sidecar(tmp_path, config, metrics=True)
    scrape = f"127.0.0.1:{sidecar.extra['metrics_port']}"  # /metrics without credentials
    try:
        async with aiohttp.ClientSession() as http:
            before, _ = await hammer(http, [sidecar.url], 0.5)
            async with http.get(sidecar.url + "/readyz") as resp:
                ready = json.loads(await resp.read())
            detail = ready["checks"]["ratelimit"]["detail"]
            assert "1 tenant override" in detail, detail
            assert ": reachable" in detail, detail
            await proxy.stop()
            after, _ = await hammer(http, [sidecar.url], 1.0)
            async with http.get(sidecar.url + "/readyz") as resp:
                ready_after = json.loads(await resp.read())
            metrics = await (await http.get(f"http://{scrape}/metrics")).text()
        print(f"\nbefore Redis went away: {before}; after: {after}")
        for counts in (before, after):
            assert all(code < 500 for code in counts), counts
        # The local tier still limits: admitted within its own 5 + 5/s.
        assert after.get(429, 0) > 0
        assert 0 < sum(n for c, n in after.items() if c != 429) <= 5 * 1.5 + 5
        assert "failing open" in ready_after["checks"]["ratelimit"]["detail"]
        assert ready_after["checks"]["ratelimit"]["ok"] is True
        fail_open = [
            line
            for line in metrics.splitlines()
            if line.startswith("sidecar_ratelimit_global_fail_open_total ")
        ]
        assert fail_open
        assert float(fail_open[0].split()[1]) > 0
    finally:
        sidecar.stop()
    log = sidecar.log()
    assert log.count("failing open to the local tier") == 1, log


async def test_unauthenticated_limited_per_address_authenticated_not(
    tmp_path: Path, store: processes.Proc
) -> None:
    config = sidecar_config(tmp_path, store.url, "", "")
    config["rateLimit"] = {"anonymous": {"rate": 0.1, "burst": 3}}
    sidecar = processes.start_sidecar(tmp_path, config)
    try:
        async with aiohttp.ClientSession() as http:
            codes = []
            for _ in range(5):
                async with http.get(sidecar.url + PATH) as resp:
                    codes.append(resp.status)
                    if resp.status == 429:
                        assert resp.headers["Retry-After"] == "10"
                        assert (await resp.json())["reason"] == "TooManyRequests"
            assert codes == [401, 401, 401, 429, 429]
            # Same address, valid credentials: not limited by the address's bucket.
            for _ in range(5):
                async with http.get(sidecar.url + PATH, headers=HEADERS) as resp:
                    assert resp.status != 429
                    assert resp.headers["RateLimit-Limit"] == "5"
    finally:
        sidecar.stop()

"""Scale-out on replicated Redis (DESIGN §6, §7, §11): three real sidecar processes in
front of the real backing store share one quota ledger and one global rate-limit tier,
first on the session's six-node Redis Cluster, then on its Sentinel set (whose data
nodes require the password the URL carries).

On each topology: 200 concurrent creates against a quota of 20 admit exactly 20; the
global tier holds a tenant to its rate across the three processes; `/readyz` names the
topology and its state (never the password); and when the master holding a tenant
is SIGKILLed, that tenant's creates fail closed (503) while its reads go on (the
global tier failing open, counted), creates work again once a replica has taken
over, and `sidecar quota reconcile` leaves `used` equal to the store's count, never
above the limit. The killed node is started again (as a replica) before the next test.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.rigs import processes
from tests.rigs.policies import admin_policy
from tests.rigs.redis_topologies import (
    SENTINEL_PASSWORD,
    Node,
    RedisClusterRig,
    SentinelRig,
    Topology,
)
from tests.rigs.waiting import eventually

LIMIT = 20
RACE = 200
RATE, BURST = 5, 5
# A replica takes over within a few seconds (node timeout 1 s); this only guards a hang.
FAILOVER_WITHIN = 20.0
TENANTS = {"acme": "alice", "beta": "bob", "gamma": "carol"}
EXTRA = f"""\
kind: RateLimit
metadata: {{name: default}}
spec: {{tenant: "*", rate: 1000, burst: 1000, maxInFlight: 1000}}
---
kind: RateLimit
metadata: {{name: beta}}
spec: {{tenant: beta, rate: {RATE}, burst: {BURST}, maxInFlight: 1000}}
---
kind: TenantResourceQuota
metadata: {{name: acme, tenant: acme}}
spec: {{hard: {{servers: {LIMIT}}}}}
---
kind: TenantResourceQuota
metadata: {{name: gamma, tenant: gamma}}
spec: {{hard: {{servers: {LIMIT}}}}}
"""
ADMIN = {"Authorization": "Bearer admin-token"}
STORE_HEADERS = {"X-Remote-User": "test", "X-Remote-Tenant": "system"}


def servers(tenant: str) -> str:
    return f"/apis/compute/v1/tenants/{tenant}/namespaces/default/servers"


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANTS[tenant]}-token"}


@dataclass
class ScaleOut:
    kind: str
    rig: Topology
    url: str
    store: processes.Proc
    sidecars: list[processes.Proc]
    config: dict[str, Any]
    tmp: Path


@pytest.fixture(scope="module", params=["redis-cluster", "redis-sentinel"])
def scale_out(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScaleOut]:
    kind = request.param
    rig: Topology = request.getfixturevalue(
        "redis_cluster" if kind == "redis-cluster" else "redis_sentinel"
    )
    tmp = tmp_path_factory.mktemp(kind)
    prefix = f"scale-{uuid.uuid4().hex[:8]}:"
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(admin_policy("servers: 1000", TENANTS, EXTRA))
    tokens = [{"token": "admin-token", "user": "admin", "tenant": "system", "groups": []}]
    tokens += [
        {"token": f"{user}-token", "user": user, "tenant": t, "groups": []}
        for t, user in TENANTS.items()
    ]
    store = processes.start_store(tmp)
    config: dict[str, Any] = {
        "upstream": store.url,
        "policies": str(policies),
        "identity": {"tokenFile": str(processes.write_tokens(tmp, tokens))},
        "ledger": rig.url,
        "quota": {"redisPrefix": prefix + "q:"},
        "rateLimit": {"global": rig.url, "globalPrefix": prefix + "rl:"},
        "reload": {"enabled": False},
    }
    sidecars: list[processes.Proc] = []
    try:
        with ThreadPoolExecutor(3) as pool:  # started side by side, each waited for
            starting = [
                pool.submit(processes.start_sidecar, tmp, config, name=f"sc{i}") for i in range(3)
            ]
        sidecars += [f.result() for f in starting if f.exception() is None]
        for f in starting:
            if (error := f.exception()) is not None:
                raise error  # those that started are stopped below
        env = ScaleOut(kind, rig, rig.url, store, sidecars, config, tmp)
        asyncio.run(_make_tenants(env))
        yield env
    finally:
        for s in sidecars:
            s.stop()
        store.stop()
        rig.delete(prefix)


async def _make_tenants(env: ScaleOut) -> None:
    async with aiohttp.ClientSession() as http:
        for t in TENANTS:
            async with http.post(
                f"{env.sidecars[0].url}/api/v1/tenants",
                json={"metadata": {"name": t}},
                headers=ADMIN,
            ) as r:
                assert r.status in (200, 201), await r.text()


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def create(http: aiohttp.ClientSession, base: str, tenant: str, name: str) -> int:
    async with http.post(
        base + servers(tenant), json={"metadata": {"name": name}}, headers=bearer(tenant)
    ) as r:
        body = await r.json()
        if r.status == 403:
            assert body["reason"] == "QuotaExceeded", body
        if r.status == 503:
            assert body["kind"] == "Status", body
            assert "ledger" in body["message"], body
        return r.status


async def store_count(http: aiohttp.ClientSession, env: ScaleOut, tenant: str) -> int:
    async with http.get(env.store.url + servers(tenant), headers=STORE_HEADERS) as r:
        assert r.status == 200, await r.text()
        return len((await r.json())["items"])


async def quota_row(http: aiohttp.ClientSession, base: str, tenant: str) -> dict[str, Any]:
    async with http.get(f"{base}/quota/v1/tenants/{tenant}", headers=ADMIN) as r:
        assert r.status == 200, await r.text()
        rows = {q["resource"]: q for q in (await r.json())["quotas"]}
    row: dict[str, Any] = rows["servers"]
    return row


async def test_200_creates_over_3_sidecars_admit_exactly_the_quota(
    scale_out: ScaleOut, http: aiohttp.ClientSession
) -> None:
    env = scale_out
    statuses = await asyncio.gather(
        *(create(http, env.sidecars[i % 3].url, "acme", f"s{i}") for i in range(RACE))
    )
    assert statuses.count(201) == LIMIT, sorted(set(statuses))
    assert statuses.count(403) == RACE - LIMIT
    assert await store_count(http, env, "acme") == LIMIT
    row = await quota_row(http, env.sidecars[1].url, "acme")
    assert (row["used"], row["in_progress"]) == (LIMIT, 0)


async def test_the_global_tier_holds_a_tenant_to_its_rate_across_sidecars(
    scale_out: ScaleOut, http: aiohttp.ClientSession
) -> None:
    env = scale_out
    counts: dict[int, int] = {}
    seconds = 1.5
    start = time.monotonic()

    async def worker(base: str) -> None:
        while time.monotonic() - start < seconds:
            async with http.get(base + servers("beta"), headers=bearer("beta")) as r:
                await r.read()
                counts[r.status] = counts.get(r.status, 0) + 1
                assert r.headers["RateLimit-Limit"] == str(BURST)
            await asyncio.sleep(0.005)  # the behaviour under test: a steady request rate

    await asyncio.gather(*(worker(s.url) for s in env.sidecars for _ in range(2)))
    elapsed = time.monotonic() - start
    admitted = sum(n for code, n in counts.items() if code != 429)
    assert all(code < 500 for code in counts), counts
    assert counts.get(429, 0) > 0, counts
    # Each process alone would admit BURST + RATE/s; the three together stay within one.
    assert BURST <= admitted <= BURST + RATE * elapsed + 1, (counts, elapsed)


async def test_readyz_names_the_topology_and_never_the_password(
    scale_out: ScaleOut, http: aiohttp.ClientSession
) -> None:
    env = scale_out
    async with http.get(env.sidecars[2].url + "/readyz") as r:
        assert r.status == 200
        text = await r.text()
    checks = json.loads(text)["checks"]
    assert SENTINEL_PASSWORD not in text
    if env.kind == "redis-cluster":
        assert checks["ledger"]["detail"] == "ledger redis+cluster: 3 masters ok"
        assert checks["ratelimit"]["detail"].endswith(": 3 masters ok")
    else:
        assert isinstance(env.rig, SentinelRig)
        master = f"master 127.0.0.1:{env.rig.master().port} ok"
        assert checks["ledger"]["detail"] == f"ledger redis+sentinel mymaster: {master}"
        assert checks["ratelimit"]["detail"].endswith(f"/mymaster: {master}")
        assert "redis+sentinel://:***@127.0.0.1:" in checks["ratelimit"]["detail"]
    assert checks["ledger"]["ok"] is True


def kill_master(env: ScaleOut, tenant: str) -> Node:
    if isinstance(env.rig, RedisClusterRig):
        return env.rig.kill_master_of(f"{{{tenant}}}")
    return env.rig.kill_master()


async def fail_open_count(http: aiohttp.ClientSession, env: ScaleOut) -> float:
    total = 0.0
    for s in env.sidecars:
        async with http.get(s.url + "/metrics", headers=ADMIN) as r:
            for line in (await r.text()).splitlines():
                if line.startswith("sidecar_ratelimit_global_fail_open_total "):
                    total += float(line.split()[1])
    return total


def reconcile(env: ScaleOut) -> dict[str, Any]:
    """`sidecar quota reconcile` of every tenant (found in the store and by a SCAN of
    every master of the ledger)."""
    cfg = processes.write_config(env.tmp, {**env.config, "listen": "127.0.0.1:1"}, "cli.yaml")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "sidecar.cli", "quota", "reconcile"),
            *("--config", str(cfg), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert SENTINEL_PASSWORD not in done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def test_a_master_failover_then_creates_work_again_and_reconcile_restores_used(
    scale_out: ScaleOut, http: aiohttp.ClientSession
) -> None:
    env = scale_out
    bases = [s.url for s in env.sidecars]
    for i in range(5):
        assert await create(http, bases[i % 3], "gamma", f"before-{i}") == 201
    fail_open_before = await fail_open_count(http, env)
    # Creates in flight while the master goes: each is created or refused, never a 500.
    in_flight = [
        asyncio.create_task(create(http, bases[i % 3], "gamma", f"during-{i}")) for i in range(6)
    ]
    victim = kill_master(env, "gamma")
    killed = time.monotonic()
    try:
        assert set(await asyncio.gather(*in_flight)) <= {201, 503}
        # No master holds gamma now (a replica takes over only after the node timeout).
        assert await create(http, bases[0], "gamma", "refused") == 503
        # Reads are untouched; the global tier fails open for them, and counts it.
        async with http.get(bases[1] + servers("gamma"), headers=bearer("gamma")) as r:
            assert r.status == 200, await r.text()
        assert await fail_open_count(http, env) > fail_open_before
        statuses: list[int] = []

        async def created_again() -> bool:
            statuses.append(
                await create(http, bases[len(statuses) % 3], "gamma", f"after-{len(statuses)}")
            )
            return statuses[-1] == 201

        await eventually(created_again, FAILOVER_WITHIN, what="a create succeeds after failover")
        print(f"\n{env.kind}: creates work again {time.monotonic() - killed:.1f} s after the kill")
        assert set(statuses) <= {201, 503}, statuses
        # The rest of the quota, raced from every sidecar: never above the limit.
        await asyncio.gather(*(create(http, bases[i % 3], "gamma", f"rest-{i}") for i in range(30)))
        real = await store_count(http, env, "gamma")
        assert real <= LIMIT
        result = reconcile(env)
        assert result["gamma"]["after"].get("servers", 0) == real
        acme = result.get("acme", {}).get("after", {}).get("servers", 0)  # the race's
        assert acme == await store_count(http, env, "acme")
        row = await quota_row(http, bases[2], "gamma")
        assert row["used"] == real
        assert row["used"] <= LIMIT
    finally:
        await asyncio.to_thread(env.rig.heal, victim)

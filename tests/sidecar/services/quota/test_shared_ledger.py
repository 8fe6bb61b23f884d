"""Quotas across real processes: several sidecars sharing one ledger in front of the
real backing store; SIGKILL between reserve and commit; reconcile after kills."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.services.quota.ledger import Clock, Ledger, QuotaExceeded, new_reservation_id
from tests.rigs import processes
from tests.rigs.clock import FakeClock
from tests.rigs.ledgers import make_ledger
from tests.rigs.policies import admin_policy
from tests.rigs.waiting import eventually

POLICY = admin_policy("servers: LIMIT")
ADMIN = {"Authorization": "Bearer admin-token"}
ALICE = {"Authorization": "Bearer alice-token"}
SERVERS = "/apis/compute/v1/tenants/acme/namespaces/default/servers"
STORE_HEADERS = {"X-Remote-User": "test", "X-Remote-Tenant": "system"}


def base_config(tmp: Path, upstream: str, limit: int, ledger: str, **extra: Any) -> dict[str, Any]:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(POLICY.replace("LIMIT", str(limit)))
    tokens = processes.write_tokens(
        tmp,
        [
            {"token": "admin-token", "user": "admin", "tenant": "system", "groups": []},
            {"token": "alice-token", "user": "alice", "tenant": "acme", "groups": []},
        ],
    )
    config: dict[str, Any] = {
        "upstream": upstream,
        "policies": str(policies),
        "ledger": ledger,
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
    }
    config.update(extra)
    return config


def ledger_setting(kind: str, tmp: Path, request: pytest.FixtureRequest) -> tuple[str, str]:
    """(ledger URL, redis prefix) for the backend under test."""
    if kind == "redis":
        return request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
    return f"sqlite:///{tmp / 'shared-ledger.db'}", ""


def open_test_ledger(
    kind: str, tmp: Path, url: str, prefix: str, ttl: float = 300, clock: Clock = time.time
) -> Ledger:
    if kind == "redis":
        return make_ledger("redis", tmp, clock, ttl, redis_url=url, prefix=prefix)
    from sidecar.services.quota.sqlite import SqliteLedger

    return SqliteLedger(str(tmp / "shared-ledger.db"), ttl, clock)


async def make_tenant(http: aiohttp.ClientSession, base: str) -> None:
    async with http.post(
        f"{base}/api/v1/tenants", json={"metadata": {"name": "acme"}}, headers=ADMIN
    ) as r:
        assert r.status in (200, 201), await r.text()


async def store_count(http: aiohttp.ClientSession, store: processes.Proc) -> int:
    async with http.get(f"{store.url}{SERVERS}", headers=STORE_HEADERS) as r:
        assert r.status == 200, await r.text()
        return len((await r.json())["items"])


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_race_200_creates_3_sidecars_limit_50(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    store: processes.Proc,
    http: aiohttp.ClientSession,
) -> None:
    url, prefix = ledger_setting(kind, tmp_path, request)
    extra = {"quota": {"redisPrefix": prefix}} if prefix else {}
    config = base_config(tmp_path, store.url, 50, url, **extra)
    sidecars: list[processes.Proc] = []
    try:  # started one by one: if one fails to start, those already running are stopped
        for i in range(3):
            sidecars.append(processes.start_sidecar(tmp_path, config, name=f"sc{i}"))
        await make_tenant(http, sidecars[0].url)

        async def one(i: int) -> int:
            base = sidecars[i % 3].url
            async with http.post(
                f"{base}{SERVERS}", json={"metadata": {"name": f"s{i}"}}, headers=ALICE
            ) as r:
                body = await r.json()
                if r.status == 403:
                    assert body["reason"] == "QuotaExceeded"
                return r.status

        statuses = await asyncio.gather(*(one(i) for i in range(200)))
        assert statuses.count(201) == 50, sorted(set(statuses))
        assert statuses.count(403) == 150
        assert await store_count(http, store) == 50
        async with http.get(f"{sidecars[1].url}/quota/v1/tenants/acme", headers=ADMIN) as r:
            rows = {q["resource"]: q for q in (await r.json())["quotas"]}
        assert rows["servers"]["used"] == 50
        assert rows["servers"]["in_progress"] == 0
    finally:
        for s in sidecars:
            s.stop()


class SlowStore:
    """An upstream that never answers creates in time: the sidecar is killed meanwhile."""

    def __init__(self) -> None:
        self.posts = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.any)
        return app

    async def any(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            self.posts += 1
            await asyncio.sleep(30)  # the behaviour under test: a store that never answers
        return web.json_response({"kind": "Status", "status": "Success"})


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_sigkill_between_reserve_and_commit_frees_after_ttl(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, http: aiohttp.ClientSession
) -> None:
    url, prefix = ledger_setting(kind, tmp_path, request)
    slow = SlowStore()
    upstream = TestServer(slow.app(), host="127.0.0.1")
    await upstream.start_server()
    ttl = 2.0
    quota: dict[str, Any] = {"reservationTtlSeconds": ttl}
    if prefix:
        quota["redisPrefix"] = prefix
    config = base_config(
        tmp_path,
        str(upstream.make_url("")).rstrip("/"),
        1,
        url,
        quota=quota,
        limits={"upstreamReadTimeout": 60},
    )
    sidecar = processes.start_sidecar(tmp_path, config)
    clock = FakeClock(time.time())  # the test's view of the shared ledger
    ledger = open_test_ledger(kind, tmp_path, url, prefix, ttl, clock)
    try:
        task = asyncio.create_task(
            http.post(f"{sidecar.url}{SERVERS}", json={"metadata": {"name": "x"}}, headers=ALICE)
        )
        await eventually(lambda: slow.posts, 5, what="the create reached the store")
        assert slow.posts == 1
        sidecar.kill()
        with pytest.raises(aiohttp.ClientError):
            await task
        usage = await ledger.usage("acme")
        assert usage.get_in_progress("", "servers") == 1
        with pytest.raises(QuotaExceeded):
            await ledger.reserve(
                "acme", "default", {"servers": 1}, {"servers": 1}, {}, new_reservation_id()
            )
        clock.now = time.time() + ttl + 0.5  # past the TTL of the killed sidecar's reservation
        assert (await ledger.usage("acme")).get_in_progress("", "servers") == 0
        await ledger.reserve(
            "acme", "default", {"servers": 1}, {"servers": 1}, {}, new_reservation_id()
        )
    finally:
        await ledger.close()
        sidecar.stop()
        await upstream.close()


def run_cli(*args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "quota", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_reconcile_after_random_kills_matches_the_store(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    store: processes.Proc,
    http: aiohttp.ClientSession,
) -> None:
    url, prefix = ledger_setting(kind, tmp_path, request)
    quota: dict[str, Any] = {"reservationTtlSeconds": 300}
    if prefix:
        quota["redisPrefix"] = prefix
    config = base_config(tmp_path, store.url, 1000, url, quota=quota)
    rng = random.Random(7)
    sidecar = processes.start_sidecar(tmp_path, config)
    await make_tenant(http, sidecar.url)
    n = 0
    try:
        for _ in range(3):

            async def one(i: int, base: str) -> None:
                try:
                    async with http.post(
                        f"{base}{SERVERS}", json={"metadata": {"name": f"k{i}"}}, headers=ALICE
                    ) as r:
                        await r.read()
                except aiohttp.ClientError:
                    pass

            tasks = [asyncio.create_task(one(n + i, sidecar.url)) for i in range(40)]
            n += 40
            # the behaviour under test: a SIGKILL at a random moment of the traffic
            await asyncio.sleep(rng.uniform(0.0, 0.15))
            sidecar.kill()
            await asyncio.gather(*tasks)
            sidecar = processes.start_sidecar(tmp_path, config)
        # Out-of-band drift too: an object created straight in the store, one deleted.
        async with http.post(
            f"{store.url}{SERVERS}", json={"metadata": {"name": "oob"}}, headers=STORE_HEADERS
        ) as r:
            assert r.status == 201
        real = await store_count(http, store)
        cfg = processes.write_config(tmp_path, {**config, "listen": "127.0.0.1:1"}, "cli.yaml")
        code, out = run_cli("reconcile", "--config", str(cfg), "--json")
        assert code == 0, out
        assert json.loads(out)["acme"]["after"].get("servers", 0) == real
        code, out = run_cli("show", "acme", "--config", str(cfg), "--json")
        assert code == 0, out
        rows = {q["resource"]: q for q in json.loads(out)["quotas"]}
        assert rows["servers"]["used"] == real
        code, out = run_cli("show", "acme", "--config", str(cfg))
        assert code == 0
        assert "HARD_LIMIT" in out
        assert "servers" in out
    finally:
        sidecar.stop()


def test_cli_update_and_defaults(tmp_path: Path) -> None:
    config = base_config(
        tmp_path, f"http://127.0.0.1:{processes.free_port()}", 5, f"sqlite:///{tmp_path / 'cli.db'}"
    )
    cfg = processes.write_config(tmp_path, config, "cli.yaml")
    code, out = run_cli("defaults", "--config", str(cfg), "--json")
    assert code == 0
    assert json.loads(out) == {"hard": {"servers": 5}}
    # The store is down: update refuses unless --force.
    code, out = run_cli("update", "acme", "servers", "7", "--config", str(cfg))
    assert code != 0
    assert "unreachable" in out
    code, out = run_cli("update", "acme", "servers", "7", "--force", "--config", str(cfg), "--json")
    assert code == 0, out
    rows = {q["resource"]: q for q in json.loads(out)["quotas"]}
    assert rows["servers"]["hard_limit"] == 7
    assert rows["servers"]["source"] == "api"
    code, out = run_cli("update", "acme", "servers", "-3", "--force", "--config", str(cfg))
    assert code == 1
    assert "negative" in out
    code, out = run_cli("list", "--config", str(cfg))
    assert code == 0
    assert "acme" in out
    assert os.path.exists(tmp_path / "cli.db")


async def test_reconcile_settles_creates_left_unsettled(
    tmp_path: Path, store: processes.Proc, http: aiohttp.ClientSession
) -> None:
    """Reservations marked unsettled (a create cut at a shutdown, say) are read back by
    `sidecar quota reconcile`: the one the store made is charged as stored, one not
    made whose settling window has passed is released; one not made whose window is
    still open (the upstream may still make it) stays in progress, marked."""
    from sidecar.services.quota.ledger import ObjectRef
    from sidecar.services.quota.sqlite import SqliteLedger

    async with http.post(
        f"{store.url}/api/v1/tenants", json={"metadata": {"name": "acme"}}, headers=STORE_HEADERS
    ) as r:
        assert r.status == 201, await r.text()
    made = {
        "metadata": {"name": "made"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "300m"}}}]},
    }
    async with http.post(f"{store.url}{SERVERS}", json=made, headers=STORE_HEADERS) as r:
        assert r.status == 201, await r.text()
    db = tmp_path / "ledger.db"
    ledger = SqliteLedger(str(db), 300)
    try:
        now = ledger.clock()
        for name, release_after in (("made", now + 60), ("never", now - 1), ("late", now + 60)):
            reservation = await ledger.reserve(
                "acme", "default", {"servers": 1}, {}, {}, new_reservation_id()
            )
            await ledger.mark_unsettled(
                reservation, ObjectRef("acme", "default", "servers", name), release_after
            )
        assert (await ledger.usage("acme")).get_in_progress("", "servers") == 3
    finally:
        await ledger.close()
    config = base_config(tmp_path, store.url, 10, f"sqlite:///{db}")
    cfg = processes.write_config(tmp_path, {**config, "listen": "127.0.0.1:1"}, "cli.yaml")
    code, out = run_cli("reconcile", "--config", str(cfg), "--json")
    assert code == 0, out
    ledger = SqliteLedger(str(db), 300)
    try:
        usage = await ledger.usage("acme")
        assert usage.get_in_progress("", "servers") == 1
        assert usage.get_used("", "servers") == 1
        assert usage.get_used("", "requests.cpu") == 300  # as stored
        [(_, left, _)] = await ledger.unsettled("acme")
        assert left.name == "late"
    finally:
        await ledger.close()

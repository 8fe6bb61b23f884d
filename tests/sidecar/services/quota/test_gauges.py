"""Quota gauges and refusals on /metrics, through the real sidecar and backing store
processes with the shipped policies (acme: servers hard limit 100 from its
TenantResourceQuota)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.rigs import paths, processes
from tests.rigs.waiting import eventually

ROOT = paths.ROOT
SERVERS = "/apis/compute/v1/tenants/acme/namespaces/default/servers"


@pytest.fixture
async def sidecar_url(tmp_path: Path) -> AsyncIterator[str]:
    store = await asyncio.to_thread(processes.start_store, tmp_path)
    tokens = processes.write_tokens(
        tmp_path,
        [
            {"token": "t-admin", "user": "admin", "tenant": "system", "groups": []},
            {"token": "t-alice", "user": "alice", "tenant": "acme", "groups": ["tenant-admins"]},
        ],
    )
    proc = await asyncio.to_thread(
        processes.start_sidecar,
        tmp_path,
        {
            "upstream": store.url,
            "policies": str(ROOT / "policies"),
            "identity": {"tokenFile": str(tokens)},
            "reload": {"enabled": False},
            # The gauges follow usage at this interval (config, not a constant).
            "quota": {"gaugeIntervalSeconds": 0.2},
        },
    )
    try:
        yield proc.url
    finally:
        proc.stop()
        store.stop()


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_used_and_hard_gauges_follow_creates(sidecar_url: str) -> None:
    admin = {"Authorization": "Bearer t-admin"}
    alice = {"Authorization": "Bearer t-alice"}
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{sidecar_url}/api/v1/tenants", headers=admin, json={"metadata": {"name": "acme"}}
        ) as r:
            assert r.status == 201, await r.text()
        for name in ("a1", "a2"):
            async with s.post(
                f"{sidecar_url}{SERVERS}", headers=alice, json={"metadata": {"name": name}}
            ) as r:
                assert r.status == 201, await r.text()
        # The gauges are refreshed every gaugeIntervalSeconds for tenants with recent activity.

        async def refreshed() -> str | None:
            async with s.get(f"{sidecar_url}/metrics", headers=admin) as r:
                text = await r.text()
            used = sample(text, "sidecar_quota_used", tenant="acme", resource="servers")
            return text if used == 2.0 else None

        text = await eventually(refreshed, what="sidecar_quota_used reaches 2")
        hard = sample(text, "sidecar_quota_hard", tenant="acme", resource="servers")
        assert hard == 100.0
        in_progress = sample(text, "sidecar_quota_in_progress", tenant="acme", resource="servers")
        assert in_progress == 0.0

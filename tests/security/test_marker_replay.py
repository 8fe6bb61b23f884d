"""Hostile review of the decision service (redteam.md class 9, issue 31): charge-once.

A client that reaches the decision listener (bound to loopback by the generated
configs, but the webhook's docs put a TLS terminator before it for the API server)
asks `/nginx` once, is charged once, and gets the `x-sidecar-decided` marker; it then
sent the same request to the proxy with that marker 20 times in the marker's 30 s, none
charged (burst 6). Fixed: a marker saves one charge, once per proxy process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from yarl import URL

from sidecar.cli.fronts_launch import envoy_binary, nginx_binary
from sidecar.cli.launch import StartError
from tests.rigs.fronts import Fronts, running_fronts
from tests.rigs.policies import EVERYTHING

pytestmark = pytest.mark.asyncio(loop_scope="module")

try:
    envoy_binary()
    nginx_binary()
except StartError as exc:  # pragma: no cover - the fronts are in the dev extra / CI
    pytest.skip(str(exc), allow_module_level=True)

BURST = 6
POLICY = (
    EVERYTHING
    + f"""\
---
kind: ClusterRole
metadata: {{name: view-cm}}
rules:
- {{apiGroups: [""], resources: [configmaps], verbs: [get, list]}}
---
kind: RateLimit
metadata: {{name: slow}}
spec: {{tenant: slow, rate: 0.001, burst: {BURST}}}
---
kind: TenantRoleBinding
metadata: {{name: slow-view, tenant: slow}}
roleRef: {{kind: ClusterRole, name: view-cm}}
subjects: [{{kind: User, name: sam}}]
"""
)
TOKENS: list[dict[str, Any]] = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "sam", "user": "sam", "tenant": "slow", "groups": []},
]
TARGET = "/api/v1/namespaces/ns1/configmaps"  # a short path: the `proxy` route


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fronts(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fronts]:
    tmp = tmp_path_factory.mktemp("fronts-marker")
    async with running_fronts(tmp, POLICY, TOKENS) as running:
        async with aiohttp.ClientSession() as http:
            for target, name in (
                ("/api/v1/tenants", "slow"),
                ("/api/v1/tenants/slow/namespaces", "ns1"),
            ):
                async with http.post(
                    running.proxy + target,
                    json={"metadata": {"name": name}},
                    headers={"Authorization": "Bearer admin"},
                ) as r:
                    assert r.status == 201, await r.text()
        yield running


async def test_a_replayed_marker_is_charged(fronts: Fronts) -> None:
    auth = {"Authorization": "Bearer sam"}
    async with aiohttp.ClientSession() as http:
        async with http.get(
            fronts.authz + "/nginx",
            headers={**auth, "X-Original-Method": "GET", "X-Original-URI": TARGET},
        ) as r:
            assert r.status == 204
            assert r.headers["x-sidecar-route"] == "proxy"
            marker = r.headers["x-sidecar-decided"]
        statuses = []
        for _ in range(BURST + 2):
            async with http.get(
                URL(fronts.proxy + TARGET, encoded=True),
                headers={**auth, "x-sidecar-decided": marker},
            ) as r:
                statuses.append(r.status)
    # The check took one token and the first use of its marker none; every replay one.
    assert statuses == [200] * BURST + [429] * 2, statuses

"""Hostile review of the decision service (redteam.md class 9, issue 31) against the
tenant contexts of issue 29 (`/tenants/{t}/…`, DESIGN §3), through real Envoy (HTTP and
gRPC ext_authz) and nginx from the generated configs.

Found: the decider read a context path as a non-resource URL. A tenant's own kubectl
context through a front was a 403 the proxy never gives; another tenant's context a
403 instead of the proxy's concealing 404. With a `nonResourceURLs` grant it was
allowed as a URL and charged twice (the marker named the whole path, the proxy checks
the rest). Fixed: the decider enters the context as the proxy's dispatch does, runs the
tenant-context stage, and never routes a context path `direct` (the front would forward
the context prefix the upstream cannot read)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from yarl import URL

from sidecar.cli.fronts_launch import envoy_binary, nginx_binary
from sidecar.cli.launch import StartError
from tests.rigs.fronts import CORPUS_HEADER, Fronts, running_fronts
from tests.rigs.policies import EVERYTHING

pytestmark = pytest.mark.asyncio(loop_scope="module")

try:
    envoy_binary()
    nginx_binary()
except StartError as exc:  # pragma: no cover - the fronts are in the dev extra / CI
    pytest.skip(str(exc), allow_module_level=True)

TENANTS = ("ctx1", "ctx2", "ctx3", "ctx4")
BURST = 4
POLICY = (
    EVERYTHING
    + """\
---
kind: ClusterRole
metadata: {name: view-cm}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get, list]}
"""
)
for _t in TENANTS:
    POLICY += (
        f"---\nkind: RateLimit\nmetadata: {{name: {_t}}}\n"
        f"spec: {{tenant: {_t}, rate: 0.001, burst: {BURST}}}\n"
        f"---\nkind: TenantRoleBinding\nmetadata: {{name: {_t}-view, tenant: {_t}}}\n"
        "roleRef: {kind: ClusterRole, name: view-cm}\n"
        "subjects: [{kind: User, name: sam}]\n"
    )
POLICY += """\
---
kind: TenantRoleBinding
metadata: {name: other-view, tenant: other}
roleRef: {kind: ClusterRole, name: view-cm}
subjects: [{kind: User, name: eve}]
"""
TOKENS: list[dict[str, Any]] = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "eve", "user": "eve", "tenant": "other", "groups": []},
] + [{"token": f"sam-{t}", "user": "sam", "tenant": t, "groups": []} for t in TENANTS]


async def _call(
    http: aiohttp.ClientSession,
    base: str,
    method: str,
    target: str,
    token: str,
    body: Any = None,
    tag: str = "",
) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}", CORPUS_HEADER: tag}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    async with http.request(
        method, URL(base + target, encoded=True), headers=headers, data=data
    ) as r:
        return r.status, await r.read()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fronts(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fronts]:
    tmp = tmp_path_factory.mktemp("fronts-context")
    async with running_fronts(tmp, POLICY, TOKENS) as running:
        async with aiohttp.ClientSession() as http:
            for tenant in (*TENANTS, "other"):
                for target, name in (
                    ("/api/v1/tenants", tenant),
                    (f"/api/v1/tenants/{tenant}/namespaces", "ns1"),
                ):
                    status, body = await _call(
                        http, running.proxy, "POST", target, "admin", {"metadata": {"name": name}}
                    )
                    assert status == 201, body
                status, body = await _call(
                    http,
                    running.proxy,
                    "POST",
                    f"/api/v1/tenants/{tenant}/namespaces/ns1/configmaps",
                    "admin",
                    {"metadata": {"name": "cm0"}, "data": {"a": "b"}},
                )
                assert status == 201, body
        yield running


async def test_a_tenant_context_through_a_front_is_the_proxys_and_charged_once(
    fronts: Fronts,
) -> None:
    """Burst 4, no refill to speak of: through each entrance, exactly 4 context reads
    pass (a second charge would refuse sooner; a 403 none), all through the proxy,
    which forwards the canonical target; nothing with the context prefix reaches the
    upstream from a front directly."""
    async with aiohttp.ClientSession() as http:
        for tenant, (name, base) in zip(TENANTS, fronts.entrances.items(), strict=True):
            targets = [
                f"/tenants/{tenant}/api/v1/namespaces/ns1/configmaps/cm0",
                f"/tenants/{tenant}/api/v1/tenants/{tenant}/namespaces/ns1/configmaps/cm0",
            ]
            statuses = []
            for n in range(BURST + 1):
                tag = f"ctx-{name}-{n}"
                status, body = await _call(
                    http, base, "GET", targets[n % 2], f"sam-{tenant}", tag=tag
                )
                statuses.append(status)
                if status == 200:
                    assert json.loads(body)["metadata"]["name"] == "cm0", (name, body)
                    seen = fronts.proxy_relay.by_corpus(tag)
                    assert [s.target for s in seen] == [
                        f"/api/v1/tenants/{tenant}/namespaces/ns1/configmaps/cm0"
                    ], (name, n)
                assert fronts.direct_relay.by_corpus(tag) == [], (name, n)
            assert statuses == [200] * BURST + [429], (name, statuses)


async def test_another_tenants_context_is_the_proxys_404_through_every_front(
    fronts: Fronts,
) -> None:
    async with aiohttp.ClientSession() as http:
        for tenant in ("ctx1", "ghost"):
            target = f"/tenants/{tenant}/api/v1/namespaces/ns1/configmaps"
            answers = {}
            for name, base in fronts.entrances.items():
                answers[name] = await _call(http, base, "GET", target, "eve")
            assert answers["proxy"][0] == 404, answers["proxy"]
            for name, answer in answers.items():
                assert answer == answers["proxy"], (tenant, name, answer)

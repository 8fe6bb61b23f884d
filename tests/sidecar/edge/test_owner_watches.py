"""Owner-filtered watches over HTTP (issue 29; DESIGN §5): the real sidecar and the real
store as processes, with a policy that reloads.

A caller whose only grant on nodes is an owner rule watches them: it sees the events of
its tenant's nodes, in order, and nothing of another tenant's; a node whose owner
changes away is a `DELETED` event that names it and nothing more. The watch is decided
again when the policy changes, like every watch: the owner rule removed, it ends
cleanly, and watching again is the concealed 404.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.rigs import processes
from tests.rigs.waiting import eventually

ADMIN = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: admin}]
"""
OWNERS = """\
---
kind: ClusterRole
metadata: {name: node-owner}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch], when: owner}
---
kind: TenantRoleBinding
metadata: {name: node-owners, tenant: acme}
roleRef: {kind: ClusterRole, name: node-owner}
subjects: [{kind: User, name: oscar}]
"""
TOKENS = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "oscar", "user": "oscar", "tenant": "acme", "groups": []},
]
# Hang guards only.
WITHIN = 10.0


@dataclass
class Rig:
    url: str
    http: aiohttp.ClientSession
    policy: Path

    async def call(self, token: str, method: str, path: str, body: Any = None) -> int:
        headers = {"Authorization": f"Bearer {token}"}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        async with self.http.request(method, self.url + path, data=data, headers=headers) as r:
            await r.read()
            return r.status

    async def node(self, name: str, owner: str) -> None:
        node = {"metadata": {"name": name}, "spec": {"owner": owner}}
        assert await self.call("admin", "POST", "/api/v1/nodes", node) == 201


@asynccontextmanager
async def rig(tmp: Path) -> AsyncIterator[Rig]:
    policies = tmp / "policies"
    policies.mkdir()
    policy = policies / "policy.yaml"
    policy.write_text(ADMIN + OWNERS)
    tokens = processes.write_tokens(tmp, TOKENS)
    store = await asyncio.to_thread(processes.start_store, tmp)
    try:
        settings = {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(tokens)},
            "reload": {"enabled": True, "debounceSeconds": 0.1, "pollSeconds": 0.2},
        }
        sidecar = await asyncio.to_thread(processes.start_sidecar, tmp, settings)
        try:
            async with aiohttp.ClientSession() as http:
                r = Rig(sidecar.url, http, policy)
                for tenant in ("acme", "beta"):
                    body = {"metadata": {"name": tenant}}
                    assert await r.call("admin", "POST", "/api/v1/tenants", body) == 201
                yield r
        finally:
            await asyncio.to_thread(sidecar.stop)
    finally:
        await asyncio.to_thread(store.stop)


async def next_event(watch: aiohttp.ClientResponse) -> dict[str, Any]:
    line = await asyncio.wait_for(watch.content.readline(), WITHIN)
    assert line, "the watch ended"
    event: dict[str, Any] = json.loads(line)
    return event


async def test_an_owner_only_watch_sees_its_tenants_nodes_until_the_policy_changes(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        watch = await r.http.get(
            r.url + "/api/v1/nodes?watch=true",
            headers={"Authorization": "Bearer oscar"},
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        assert watch.status == 200, await watch.text()
        await r.node("theirs", "beta")
        await r.node("mine", "acme")
        event = await next_event(watch)  # beta's node came first and was not sent
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "mine")
        assert await r.call("admin", "PATCH", "/api/v1/nodes/theirs", {"spec": {"x": 1}}) == 200
        assert await r.call("admin", "PATCH", "/api/v1/nodes/mine", {"spec": {"x": 2}}) == 200
        event = await next_event(watch)
        assert (event["type"], event["object"]["spec"]) == ("MODIFIED", {"owner": "acme", "x": 2})
        # Given away: a DELETED event naming it, nothing of what it became.
        body = {"spec": {"owner": "beta"}, "metadata": {"labels": {"new": "owner"}}}
        assert await r.call("admin", "PATCH", "/api/v1/nodes/mine", body) == 200
        event = await next_event(watch)
        assert event["type"] == "DELETED"
        assert set(event["object"]["metadata"]) == {"name", "uid", "resourceVersion"}
        assert "spec" not in event["object"]

        # The owner rule goes: the watch is decided again and ends cleanly.
        r.policy.write_text(ADMIN)

        async def refused() -> bool:
            return await r.call("oscar", "GET", "/api/v1/nodes") == 404

        await eventually(refused, WITHIN, what="the new policy is in force")
        await r.node("mine-later", "acme")
        rest = await asyncio.wait_for(watch.content.read(), WITHIN)
        assert b"mine-later" not in rest
        watch.release()
        async with r.http.get(
            r.url + "/api/v1/nodes?watch=true", headers={"Authorization": "Bearer oscar"}
        ) as again:
            assert again.status == 404

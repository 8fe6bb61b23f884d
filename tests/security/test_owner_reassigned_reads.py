"""Attack: reading another tenant's node through an owner cached before the node was
given away (hostile review of issue 28/29, class 8: decided on one state, applied on
another).

A read was decided on the owner the sidecar had cached for `cache.ownerTtlSeconds`,
while the answer is the store's object as it is now: acme's owner read a node, an
operator gave the node to beta (and labelled it), and for up to two seconds acme's
owner still got beta's node, labels included, and its power state. The owner behind a
read is now read fresh, as for writes. Real store and sidecar processes; the cache TTL
is set long so that the old code fails every time, not only within two seconds.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp

from sidecar.cli.launch import ProcessGroup
from tests.rigs import processes
from tests.rigs.tenancy import SHIPPED_POLICIES, TOKENS

ADMIN = {"Authorization": "Bearer admin"}
OWNER = {"Authorization": "Bearer acme-owner"}
MERGE = {"Content-Type": "application/merge-patch+json"}


async def test_a_node_given_away_is_not_read_through_the_old_owner(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, policies)
    with ProcessGroup() as started:
        store = started.add(processes.start_store(tmp_path))
        config = {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(processes.write_tokens(tmp_path, TOKENS))},
            "reload": {"enabled": False},
            "cache": {"ownerTtlSeconds": 600},
        }
        sidecar = started.add(await asyncio.to_thread(processes.start_sidecar, tmp_path, config))
        async with aiohttp.ClientSession(sidecar.url) as http:
            for tenant in ("acme", "beta"):
                async with http.post(
                    "/api/v1/tenants", json={"metadata": {"name": tenant}}, headers=ADMIN
                ) as resp:
                    assert resp.status == 201, await resp.text()
            node = {"metadata": {"name": "n1"}, "spec": {"resource_class": "x", "owner": "acme"}}
            async with http.post("/api/v1/nodes", json=node, headers=ADMIN) as resp:
                assert resp.status == 201, await resp.text()
            for path in ("/api/v1/nodes/n1", "/api/v1/nodes/n1/power"):
                async with http.get(path, headers=OWNER) as resp:  # acme's: owner cached
                    assert resp.status == 200, (path, await resp.text())

            move = {"spec": {"owner": "beta"}, "metadata": {"labels": {"beta-secret": "s3cr3t"}}}
            async with http.patch(
                "/api/v1/nodes/n1", json=move, headers={**ADMIN, **MERGE}
            ) as resp:
                assert resp.status == 200, await resp.text()

            for path in ("/api/v1/nodes/n1", "/api/v1/nodes/n1/power"):
                async with http.get(path, headers=OWNER) as resp:
                    body = await resp.text()
                    assert resp.status == 404, (path, resp.status, body)
                    assert "s3cr3t" not in body, body
                    assert "beta" not in body, body
            # The store holds beta's node as moved (the refusal changed nothing).
            async with http.get("/api/v1/nodes/n1", headers=ADMIN) as resp:
                stored = await resp.json()
            assert stored["spec"]["owner"] == "beta"

"""Attack: the owner cache authorizes writes (issue 12, finding 7; DESIGN §5).

After an admin reassigned a node to another tenant, its previous owner could still
PATCH it for `cache.ownerTtlSeconds`. The owner behind a write (update, patch,
delete, subresource writes) is always read fresh; reads may use the cache. The TTL is
long here so a cached owner would certainly still be in force. In every mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rigs import modes
from tests.rigs.tenancy import seed

MERGE = "application/merge-patch+json"


@pytest.mark.parametrize("mode", modes.MODES)
async def test_previous_owner_cannot_write_after_reassignment(tmp_path: Path, mode: str) -> None:
    async with modes.running(tmp_path, mode, cache={"ownerTtlSeconds": 60}) as env:
        await seed(env, {"n1": "acme"})
        status, body = await env.call("acme-owner", "GET", "/api/v1/nodes/n1")
        assert status == 200, body  # the owner is now cached for acme
        status, body = await env.call(
            "admin", "PATCH", "/api/v1/nodes/n1", {"spec": {"owner": "beta"}}, MERGE
        )
        assert status == 200, body
        assert body["spec"]["owner"] == "beta", body
        # (a GET may still be answered from the cached owner: not asserted)
        status, body = await env.call(
            "acme-owner", "PATCH", "/api/v1/nodes/n1", {"spec": {"resource_class": "stolen"}}, MERGE
        )
        assert status == 404, body
        assert body["kind"] == "Status", body
        status, body = await env.call(
            "acme-owner", "PUT", "/api/v1/nodes/n1/power", {"target": "power on"}
        )
        assert status == 404, body
        status, node = await env.call("admin", "GET", "/api/v1/nodes/n1")
        assert node["spec"] == {"owner": "beta", "resource_class": "gpu"}
        assert (node.get("status") or {}).get("power_state", "power off") == "power off"

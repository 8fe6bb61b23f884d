"""Hostile review of policy objects through the API (issue 30): a tenant admin holds
`*` on `*` inside its tenant, hence `escalate` and `bind` there too (as in Kubernetes).
Owner rules are the one way a tenant's binding reaches cluster-scoped objects (the nodes
it owns), so a tenant-scoped `escalate`/`bind` must not let it write one: found, a tenant
admin created a TenantRole `{nodes: [create], when: owner}`, bound it and created
cluster-scoped nodes; or bound the operators' `node-owner` ClusterRole to itself.
Both are refused now (403 naming the owner rule) and no node is created."""

from __future__ import annotations

from pathlib import Path

from tests.rigs import processes
from tests.rigs.apipolicy import RBAC, binding, role, seed, start

NODE_MAKER = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "get"], "when": "owner"}
]


async def test_a_tenant_admin_cannot_reach_cluster_objects_through_owner_rules(
    tmp_path: Path, procs: processes.Processes
) -> None:
    env = start(tmp_path, procs, sidecars=1)
    await seed(env)
    status, body = await env.call(
        "alice", "POST", f"{RBAC}/tenants/acme/tenantroles", role("nm", NODE_MAKER)
    )
    assert status == 403, body
    assert "when:owner" in body["message"]
    assert (await env.store_call("GET", f"{RBAC}/tenants/acme/tenantroles/nm"))[0] == 404
    status, body = await env.call(
        "alice",
        "POST",
        f"{RBAC}/tenants/acme/tenantrolebindings",
        binding("own-nodes", "ClusterRole", "node-owner", "alice"),
    )
    assert status == 403, body
    # An owner rule on namespaced objects only is no different: it would reach the
    # cluster level too (`resources: ["*"]`).
    wide = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["create"], "when": "owner"}]
    status, _ = await env.call("alice", "POST", f"{RBAC}/tenants/acme/tenantroles", role("w", wide))
    assert status == 403
    status, _ = await env.call(
        "alice", "POST", "/api/v1/nodes", {"metadata": {"name": "mine"}, "spec": {"owner": "acme"}}
    )
    assert status in (403, 404)
    assert (await env.store_call("GET", "/api/v1/nodes/mine"))[0] == 404
    # What the tenant admin holds in its tenant it may still write and bind.
    plain = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]
    status, _ = await env.call(
        "alice", "POST", f"{RBAC}/tenants/acme/tenantroles", role("s", plain)
    )
    assert status == 201
    status, _ = await env.call(
        "alice",
        "POST",
        f"{RBAC}/tenants/acme/tenantrolebindings",
        binding("s", "TenantRole", "s", "amy"),
    )
    assert status == 201
    # The operator (cluster-wide grants) may write owner rules.
    status, _ = await env.call(
        "admin", "POST", f"{RBAC}/tenants/acme/tenantroles", role("nm", NODE_MAKER)
    )
    assert status == 201

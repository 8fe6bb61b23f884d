"""Hostile review of policy objects through the API (issue 30): every sidecar follows the
store's policy objects through one watch per kind, and a watch event above the
follower's bound breaks that watch (re-list, pause, watch again). A tenant admin could
grow one of its Roles past that bound, a few MiB at a time (each merge patch within the
body limit, or through the `status` subresource the guard did not look at), and make
every replica's follower re-list in a loop: everyone's grants and revocations late.

Now a policy object's stored form is bounded (1 MiB, as Kubernetes bounds an object by
etcd's request size) → 413, nothing stored; writes to a policy object's subresources
→ 405 (RBAC kinds have none in Kubernetes; a quota's status is the sidecar's to say).
And the follower still applies another tenant's grant promptly afterwards."""

from __future__ import annotations

from pathlib import Path

from tests.rigs import processes
from tests.rigs.apipolicy import RBAC, ApiPolicyEnv, binding, role, seed, start
from tests.rigs.waiting import eventually

ROLES = f"{RBAC}/tenants/acme/tenantroles"
SECRETS = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]
MERGE = "application/merge-patch+json"


def padded(name: str, size: int) -> dict[str, object]:
    body = role(name, SECRETS)
    body["metadata"] = {"name": name, "annotations": {"pad": "x" * size}}
    return body


async def stored_size(env: ApiPolicyEnv, path: str) -> int:
    status, body = await env.store_call("GET", path)
    assert status == 200, body
    return len(str(body))


async def test_a_policy_object_cannot_outgrow_the_bound(
    tmp_path: Path, procs: processes.Processes
) -> None:
    env = start(tmp_path, procs, sidecars=1)
    await seed(env)
    # One write above the bound: 413, nothing stored.
    status, body = await env.call("alice", "POST", ROLES, padded("big", 1_200_000))
    assert status == 413, body
    assert body["kind"] == "Status"
    assert body["reason"] == "RequestEntityTooLarge"
    assert (await env.store_call("GET", f"{ROLES}/big"))[0] == 404
    # Grown a patch at a time: each patch within the body limit, the sum is not.
    status, body = await env.call("alice", "POST", ROLES, padded("grown", 600_000))
    assert status == 201, body
    before = await stored_size(env, f"{ROLES}/grown")
    patch = {"metadata": {"annotations": {"more": "y" * 600_000}}}
    status, body = await env.call("alice", "PATCH", f"{ROLES}/grown", patch, content_type=MERGE)
    assert status == 413, body
    assert await stored_size(env, f"{ROLES}/grown") == before


async def test_policy_object_subresources_are_not_writable(
    tmp_path: Path, procs: processes.Processes
) -> None:
    env = start(tmp_path, procs, sidecars=1)
    await seed(env)
    status, body = await env.call("alice", "POST", ROLES, role("r", SECRETS))
    assert status == 201, body
    big_status = {"status": {"pad": "z" * 2_000_000}}
    for method, body_sent, ctype in (
        ("PATCH", big_status, MERGE),
        ("PUT", {**role("r", SECRETS), **big_status}, "application/json"),
    ):
        status, body = await env.call(
            "alice", method, f"{ROLES}/r/status", body_sent, content_type=ctype
        )
        assert status == 405, (method, body)
        assert body["kind"] == "Status"
        assert body["reason"] == "MethodNotAllowed"
    stored = (await env.store_call("GET", f"{ROLES}/r"))[1]
    assert "status" not in stored
    quotas = "/api/v1/tenants/acme/namespaces/dev/resourcequotas"
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"configmaps": "5"}}}
    status, body = await env.call("alice", "POST", quotas, quota)
    assert status == 201, body
    status, body = await env.call(
        "alice", "PATCH", f"{quotas}/q/status", {"status": {"used": {}}}, content_type=MERGE
    )
    assert status == 405, body
    # Reading a subresource stays what the store says (no status subresource on a
    # role is the store's 404, not the guard's).
    status, _ = await env.call("alice", "GET", f"{quotas}/q/status")
    assert status == 200


async def test_the_follower_keeps_up_after_a_refused_growth(
    tmp_path: Path, procs: processes.Processes
) -> None:
    env = start(tmp_path, procs, sidecars=2)
    await seed(env)
    status, _ = await env.call("alice", "POST", ROLES, padded("grown", 600_000))
    assert status == 201
    for i in range(8):  # 5.4 MiB in all: above the follower's 4 MiB event bound
        patch = {"metadata": {"annotations": {f"more{i}": "y" * 600_000}}}
        status, _ = await env.call("alice", "PATCH", f"{ROLES}/grown", patch, content_type=MERGE)
        assert status == 413
    status, _ = await env.call("alice", "POST", ROLES, role("reader", SECRETS))
    assert status == 201
    status, _ = await env.call(
        "alice",
        "POST",
        f"{RBAC}/tenants/acme/tenantrolebindings",
        binding("amy-reads", "TenantRole", "reader", "amy"),
    )
    assert status == 201

    async def amy_reads() -> bool:
        status, _ = await env.call(
            "amy", "GET", "/api/v1/tenants/acme/namespaces/dev/secrets", via=1
        )
        return status == 200

    await eventually(amy_reads, 2.0, "amy's grant on the other replica within 2 s")

"""Attack: a mode opens another tenant (issue 22, item 2; DESIGN §5 "Decisions").

Found by a hostile review: with `TenantMode acme dry-run`, an acme node owner listed
every tenant's nodes, patched beta's node and powered it on. The "not owned" 404 was
not treated as isolation, the owner filter was skipped on lists in dry-run, and a
write's owner-field refusal was forwarded too. A mode (`mode: dry-run` globally or a
`TenantMode`) relaxes only refusals inside the caller's own tenant (403s of RBAC, rate
limits, quotas); isolation, concealment, the owner filter, owner-field rules on writes
and access reviews are the same in every mode. Each test runs in every mode
(`tests/rigs/modes.py`): enforced, global dry-run, and a TenantMode dry-run for the
attacker's tenant, against the real store and the real sidecar (processes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.rigs import modes
from tests.rigs.stack import ADMIN, ALICE, BOB, running_env
from tests.rigs.stack import POLICY as QUOTA_POLICY
from tests.rigs.tenancy import Env, seed

MERGE = "application/merge-patch+json"
ALLOCATIONS = "/apis/baremetal/v1/tenants/acme/allocations"


@pytest.fixture(params=modes.MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _start(tmp: Path, mode: str) -> Any:
    return modes.running(tmp, mode)


async def _node(env: Env, name: str) -> dict[str, Any]:
    status, body = await env.call("admin", "GET", f"/api/v1/nodes/{name}")
    assert status == 200, body
    return dict(body)


async def test_node_owner_never_reaches_another_tenants_nodes(tmp_path: Path, mode: str) -> None:
    async with _start(tmp_path, mode) as env:
        await seed(env, {"acme-n1": "acme", "beta-n1": "beta", "free-n1": None})
        before = {n: await _node(env, n) for n in ("beta-n1", "free-n1")}
        # The list is owner-filtered in every mode: the upstream is asked for acme's
        # nodes only, and only acme's come back.
        status, body = await env.call("acme-owner", "GET", "/api/v1/nodes")
        assert status == 200, body
        assert [i["metadata"]["name"] for i in body["items"]] == ["acme-n1"]
        assert all("owner=acme" in path for _, path in env.upstream_saw("/api/v1/nodes?"))
        assert env.upstream_saw("/api/v1/nodes?"), env.recorder.seen
        for name in ("beta-n1", "free-n1", "missing"):
            seen = len(env.recorder.seen)
            for method, path, patch in (
                ("GET", f"/api/v1/nodes/{name}", None),
                ("PATCH", f"/api/v1/nodes/{name}", {"spec": {"resource_class": "stolen"}}),
                ("PUT", f"/api/v1/nodes/{name}/power", {"target": "power on"}),
                ("PATCH", f"/api/v1/nodes/{name}", {"spec": {"owner": "acme"}}),
                ("DELETE", f"/api/v1/nodes/{name}", None),
            ):
                ctype = MERGE if method == "PATCH" else "application/json"
                status, answer = await env.call("acme-owner", method, path, patch, ctype)
                assert status == 404, (mode, method, path, answer)
                assert answer["kind"] == "Status"
                assert answer["message"] == f'nodes "{name}" not found', answer
            # Only the sidecar's own owner reads reached the store, never a write.
            assert [m for m, _ in env.recorder.seen[seen:]] == ["GET"] * (
                len(env.recorder.seen) - seen
            )
        for name, node in before.items():
            assert await _node(env, name) == node


async def test_node_owner_cannot_give_its_node_away(tmp_path: Path, mode: str) -> None:
    async with _start(tmp_path, mode) as env:
        await seed(env, {"acme-n1": "acme"})
        for patch in ({"spec": {"owner": "beta"}}, {"spec": {"owner": None}}):
            status, body = await env.call(
                "acme-owner", "PATCH", "/api/v1/nodes/acme-n1", patch, MERGE
            )
            assert status == 403, (mode, patch, body)
        assert (await _node(env, "acme-n1"))["spec"]["owner"] == "acme"


async def test_no_write_sets_another_tenant_as_owner(tmp_path: Path, mode: str) -> None:
    """Owner-field rules hold for writes the mode relaxes too: a developer may not
    update allocations at all (relaxed in dry-run, inside acme), but never to beta."""
    async with _start(tmp_path, mode) as env:
        await seed(env, {"acme-n1": "acme", "beta-n1": "beta"})
        # The tenant admin: allowed by RBAC, refused by the owner rule.
        status, body = await env.call(
            "acme-admin",
            "POST",
            ALLOCATIONS,
            {"metadata": {"name": "grab"}, "spec": {"resource_class": "gpu", "owner": "beta"}},
        )
        assert status == 403, (mode, body)
        status, body = await env.call(
            "acme-dev",
            "POST",
            ALLOCATIONS,
            {"metadata": {"name": "mine"}, "spec": {"resource_class": "gpu"}},
        )
        assert status == 201, body
        assert body["spec"]["owner"] == "acme"
        # The developer's PATCH is refused by RBAC (403): dry-run may forward it,
        # but only with the owner left to acme.
        status, body = await env.call(
            "acme-dev", "PATCH", f"{ALLOCATIONS}/mine", {"spec": {"owner": "beta"}}, MERGE
        )
        assert status == 403, (mode, body)
        status, body = await env.call(
            "acme-dev", "PATCH", f"{ALLOCATIONS}/mine", {"metadata": {"labels": {"a": "b"}}}, MERGE
        )
        assert status == (403 if mode == "enforce" else 200), (mode, body)
        status, body = await env.call("admin", "GET", f"{ALLOCATIONS}/mine")
        assert body["spec"]["owner"] == "acme"
        assert (await env.call("admin", "GET", f"{ALLOCATIONS}/grab"))[0] == 404
        assert (await _node(env, "beta-n1")).get("status", {}).get("allocation") is None


async def test_other_tenants_and_the_cluster_level_stay_concealed(
    tmp_path: Path, mode: str
) -> None:
    async with _start(tmp_path, mode) as env:
        await seed(env, {})
        status, body = await env.call(
            "admin", "POST", "/api/v1/tenants/beta/namespaces", {"metadata": {"name": "dev"}}
        )
        assert status == 201, body
        seen = len(env.recorder.seen)
        for token in ("acme-admin", "acme-dev", "acme-owner"):
            for method, path in (
                ("GET", "/api/v1/tenants/beta/namespaces"),
                ("GET", "/api/v1/tenants/beta/namespaces/dev/secrets"),
                ("DELETE", "/api/v1/tenants/beta/namespaces/dev"),
                ("GET", "/api/v1/tenants/beta"),
                # (`GET /api/v1/pods` means the caller's own tenant, DESIGN §3.)
                ("GET", "/api/v1/tenants"),
                ("DELETE", "/api/v1/tenants/beta"),
                ("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles"),
            ):
                status, answer = await env.call(token, method, path)
                assert status == 404, (mode, token, method, path, answer)
        assert env.recorder.seen[seen:] == []
        # Cluster-scoped objects a tenant user is refused stay refused in every mode:
        # its own Tenant object (403, it knows it exists) and its own quota.
        for method, path in (
            ("DELETE", "/api/v1/tenants/acme"),
            ("PUT", "/quota/v1/tenants/acme/servers"),
        ):
            status, answer = await env.call("acme-dev", method, path, {"hard_limit": 1000})
            assert status == 403, (mode, method, path, answer)
        assert env.recorder.seen[seen:] == []


async def test_own_tenant_refusals_are_relaxed_only_for_the_tenant_in_dry_run(
    tmp_path: Path, mode: str
) -> None:
    """The control: what a mode may relax it does relax, for its own tenant only."""
    async with _start(tmp_path, mode) as env:
        await seed(env, {})
        status, _ = await env.call("acme-dev", "GET", "/api/v1/tenants/acme/namespaces/dev/secrets")
        assert status == (403 if mode == "enforce" else 200)
        # beta is in dry-run only with the global mode.
        status, _ = await env.call("beta-user", "GET", "/api/v1/tenants/beta/namespaces")
        assert status == (200 if mode == "dry-run" else 403)


# -- quotas and rate limits ------------------------------------------------------------


async def test_quota_refusals_are_relaxed_for_the_callers_own_tenant_only(
    tmp_path: Path,
) -> None:
    """system and acme in dry-run, beta enforced, one configmap each: acme's own
    creates pass its quota, the operator's creates in beta do not (beta's quota is not
    the operator's tenant's), and beta's own do not."""
    policies = tmp_path / "quota-policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(QUOTA_POLICY.replace("LIMIT", "1"))
    (policies / "modes.yaml").write_text(modes.tenant_modes(("system", "acme")))
    async with running_env(tmp_path, limit=1, policies=str(policies)) as env:
        for token, tenant, second in ((ALICE, "acme", 201), (ADMIN, "beta", 403)):
            path = f"/api/v1/tenants/{tenant}/namespaces/ns1/configmaps"
            for name, want in (("cm1", 201), ("cm2", second)):
                status, body = await env.call(token, "POST", path, {"metadata": {"name": name}})
                assert status == want, (token, tenant, name, body)
        status, body = await env.call(
            BOB, "POST", "/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "cm3"}}
        )
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded"
        assert await env.stored("beta", "namespaces/ns1/configmaps") == ["cm1"]


async def test_rate_limits_are_relaxed_for_the_tenant_in_dry_run_only(tmp_path: Path) -> None:
    policies = tmp_path / "rl-policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(
        QUOTA_POLICY.replace("LIMIT", "5")
        + "".join(
            f"---\nkind: RateLimit\nmetadata: {{name: {t}}}\nspec: {{tenant: {t}, rate: 0.01, burst: 2}}\n"
            for t in ("acme", "beta")
        )
    )
    (policies / "modes.yaml").write_text(modes.tenant_modes(("acme",)))
    async with running_env(tmp_path, limit=5, policies=str(policies)) as env:
        path = "/api/v1/namespaces/ns1/configmaps"
        acme = [(await env.call(ALICE, "GET", path))[0] for _ in range(5)]
        beta = [(await env.call(BOB, "GET", path))[0] for _ in range(5)]
        assert acme == [200] * 5, acme
        assert 429 in beta, beta

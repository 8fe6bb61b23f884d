"""Attack: an owner rule on a namespaced resource leaks other tenants' objects
(issue 12; DESIGN §5).

A TenantRoleBinding to `{resources: [pods], verbs: [get, list], when: owner}` made
the cluster-level `/api/v1/pods` (every tenant's pods) reachable, owner-filtered: any
pod of another tenant whose `spec.owner` named the caller's tenant came back. A
tenant user's request never returns an object stored under another tenant, whatever
the policy: owner rules reach cluster-scoped objects only, and a target across
tenants is reachable only through a ClusterRoleBinding, in every mode. `policy check`
warns.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backing_store import resources as store_resources
from sidecar.policy.scopes import CLUSTER_SCOPED, is_cluster_scoped
from tests.rigs import modes, paths

POLICY = """\
kind: ClusterRole
metadata: {name: cluster-admin}
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["*"]
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: cluster-admin}
subjects:
- {kind: User, name: admin}
---
kind: ClusterRole
metadata: {name: pod-owner}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
  when: owner
- apiGroups: ["*"]
  resources: ["*"]
  verbs: [get, list]
  when: owner
---
kind: TenantRoleBinding
metadata: {name: pod-owners, tenant: acme}
roleRef: {kind: ClusterRole, name: pod-owner}
subjects:
- {kind: Group, name: pod-owners}
---
kind: TenantRoleBinding
metadata: {name: pod-owners, tenant: beta}
roleRef: {kind: ClusterRole, name: pod-owner}
subjects:
- {kind: Group, name: pod-owners}
"""


def write_policy(tmp: Path) -> Path:
    d = tmp / "policies"
    d.mkdir()
    (d / "policy.yaml").write_text(POLICY)
    return d


@pytest.mark.parametrize("mode", modes.MODES)
async def test_owner_rule_never_reaches_another_tenants_pods(tmp_path: Path, mode: str) -> None:
    async with modes.running(tmp_path, mode, write_policy(tmp_path)) as env:
        for tenant in ("acme", "beta"):
            assert (
                await env.call("admin", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}})
            )[0] == 201
            assert (
                await env.call(
                    "admin",
                    "POST",
                    f"/api/v1/tenants/{tenant}/namespaces",
                    {"metadata": {"name": "dev"}},
                )
            )[0] == 201
        # beta's pods that claim acme as their owner (a beta user can write anything
        # into its own objects), and one acme pod.
        for tenant, name in (("beta", "beta-pod"), ("acme", "acme-pod")):
            status, body = await env.call(
                "admin",
                "POST",
                f"/api/v1/tenants/{tenant}/namespaces/dev/pods",
                {"metadata": {"name": name}, "spec": {"owner": "acme"}},
            )
            assert status == 201, body
        for path in (
            "/api/v1/pods",
            "/api/v1/configmaps",
            "/apis/apps/v1/deployments",
            "/apis/baremetal/v1/allocations",
            "/api/v1/namespaces/dev/../pods",
        ):
            # A tenant user's cluster-level list means its own tenant (DESIGN §3):
            # allowed or not by its own grants, never another tenant's objects.
            status, body = await env.call("acme-user", "GET", path)
            assert status in (200, 400, 403, 404), (path, body)
            assert "beta-pod" not in str(body)
        status, body = await env.call("acme-user", "GET", "/api/v1/pods")
        assert status == 200, body
        assert [i["metadata"]["name"] for i in body["items"]] == ["acme-pod"]
        # Through its own tenant the owner rule still filters as before.
        status, body = await env.call("acme-user", "GET", "/api/v1/tenants/acme/pods")
        assert status == 200, body
        assert [i["metadata"]["name"] for i in body["items"]] == ["acme-pod"]
        status, body = await env.call(
            "acme-user", "GET", "/api/v1/tenants/beta/namespaces/dev/pods/beta-pod"
        )
        assert status == 404
        # The admin (ClusterRoleBinding) still lists across tenants.
        status, body = await env.call("admin", "GET", "/api/v1/pods")
        assert status == 200
        assert len(body["items"]) == 2


def test_policy_check_warns_about_owner_rules_on_namespaced_resources(tmp_path: Path) -> None:
    d = write_policy(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", "check", str(d)],
        capture_output=True,
        text=True,
        cwd=paths.ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "WARNING" in text
    assert "pods" in text
    assert "owner" in text
    assert f"{d / 'policy.yaml'}:17:" in text  # the pods rule
    assert f"{d / 'policy.yaml'}:21:" in text  # the wildcard rule
    shipped = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", "check", str(paths.ROOT / "policies")],
        capture_output=True,
        text=True,
        cwd=paths.ROOT,
        timeout=60,
    )
    assert shipped.returncode == 0
    # The shipped set carries no owner rule that could reach namespaced objects (other
    # lint warnings, e.g. the tenant admins' deliberate '*' on '*', are issue 16's).
    assert "which may be namespaced" not in shipped.stdout + shipped.stderr


def test_sidecar_scope_table_agrees_with_the_store() -> None:
    """Contract: the sidecar's table of cluster-scoped resources is exactly the store's."""
    store_cluster = {
        (r.group, r.plural)
        for r in store_resources.RESOURCES.values()
        if r.scope == store_resources.CLUSTER
    }
    for r in store_resources.RESOURCES.values():
        assert is_cluster_scoped(r.group, r.plural) == (r.scope == store_resources.CLUSTER), r
    assert store_cluster <= CLUSTER_SCOPED

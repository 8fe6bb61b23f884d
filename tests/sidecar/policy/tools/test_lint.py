"""Lint warnings of `sidecar policy check` (they fail the check only with --strict)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

LINTED = """\
kind: ClusterRole
metadata: {name: unused}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
---
kind: ClusterRole
metadata: {name: empty}
---
kind: ClusterRoleBinding
metadata: {name: to-empty}
roleRef: {kind: ClusterRole, name: empty}
subjects: [{kind: User, name: ops}]
---
kind: TenantRole
metadata: {name: dev, tenant: acme}
rules:
- {apiGroups: [""], resources: [pods, services], verbs: ["*"]}
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
- {apiGroups: [baremetal], resources: [allocations], verbs: [get], when: owner}
- {apiGroups: [""], resources: [configmaps], verbs: [get], when: owner}
---
kind: TenantRoleBinding
metadata: {name: devs, tenant: acme}
roleRef: {kind: TenantRole, name: dev}
subjects: [{kind: Group, name: devs}]
---
kind: RoleBinding
metadata: {name: devs-dev, tenant: acme, namespace: dev}
roleRef: {kind: ClusterRole, name: reader}
subjects: [{kind: Group, name: devs}, {kind: Group, name: others}]
---
kind: ClusterRole
metadata: {name: reader}
rules:
- {apiGroups: [""], resources: [services], verbs: [get]}
---
kind: ClusterRole
metadata: {name: all}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
---
kind: TenantRoleBinding
metadata: {name: admins, tenant: acme}
roleRef: {kind: ClusterRole, name: all}
subjects: [{kind: Group, name: admins}]
"""


def _check(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", "check", *extra, str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_lint_warnings(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(LINTED)
    r = _check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if "WARNING" in line]
    text = "\n".join(lines)
    assert "p.yaml:1: WARNING: ClusterRole unused is bound by nothing" in text
    assert "ClusterRoleBinding to-empty binds ClusterRole empty, which grants nothing" in text
    # pods get/list under the same binding as pods "*": shadowed; services under devs-dev
    # (namespace) shadowed by the tenant-wide "*" for devs, but not for `others`.
    assert "p.yaml:18: WARNING: rule shadowed" in text
    shadowed = [line for line in lines if "rule shadowed" in line]
    assert any("RoleBinding acme/dev/devs-dev" in line for line in shadowed)
    assert not [line for line in shadowed if "p.yaml:17:" in line]
    assert "p.yaml:19: WARNING: 'when: owner' on tenant-scoped allocations" in text
    assert "p.yaml:20: WARNING: 'when: owner' on 'configmaps', which may be namespaced" in text
    assert "TenantRoleBinding acme/admins grants every verb on every resource" in text
    strict = _check(tmp_path, "--strict")
    assert strict.returncode == 1
    assert "warning(s) (--strict)" in strict.stderr


def test_clean_policy_has_no_warnings(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "kind: ClusterRole\nmetadata: {name: r}\nrules:\n"
        "- {apiGroups: [''], resources: [pods], verbs: [get]}\n---\n"
        "kind: RoleBinding\nmetadata: {name: b, tenant: acme, namespace: dev}\n"
        "roleRef: {kind: ClusterRole, name: r}\nsubjects: [{kind: User, name: alice}]\n"
    )
    r = _check(tmp_path, "--strict")
    assert r.returncode == 0, r.stdout
    assert "WARNING" not in r.stdout + r.stderr


def test_shipped_policies_pass_check_and_test() -> None:
    policies = ROOT / "policies"
    assert _check(policies).returncode == 0
    t = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", "test", str(policies)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert t.returncode == 0, t.stdout


EVERY_TENANT = """\
kind: ClusterRole
metadata: {name: reader}
rules:
- {apiGroups: [""], resources: [configmaps, nodes], verbs: [get, list]}
- {apiGroups: [authorization.k8s.io], resources: [selfsubjectaccessreviews], verbs: [create]}
---
kind: ClusterRole
metadata: {name: discovery}
rules:
- {nonResourceURLs: [/version], verbs: [get]}
- {apiGroups: [""], resources: [nodes], verbs: [get]}
---
kind: ClusterRoleBinding
metadata: {name: everyone-reads}
roleRef: {kind: ClusterRole, name: reader}
subjects: [{kind: Group, name: "system:authenticated"}]
---
kind: ClusterRoleBinding
metadata: {name: users-read}
roleRef: {kind: ClusterRole, name: reader}
subjects: [{kind: Group, name: users, tenant: acme}, {kind: Group, name: users, tenant: beta}]
---
kind: ClusterRoleBinding
metadata: {name: acme-monitoring}
roleRef: {kind: ClusterRole, name: reader}
subjects: [{kind: Group, name: monitoring, tenant: acme}]
---
kind: ClusterRoleBinding
metadata: {name: everyone-discovers}
roleRef: {kind: ClusterRole, name: discovery}
subjects: [{kind: Group, name: "system:authenticated"}]
---
kind: TenantRoleBinding
metadata: {name: devs, tenant: acme}
roleRef: {kind: ClusterRole, name: reader}
subjects: [{kind: Group, name: "system:authenticated"}]
---
kind: TenantRoleBinding
metadata: {name: devs, tenant: beta}
roleRef: {kind: ClusterRole, name: reader}
subjects: [{kind: Group, name: devs}]
---
kind: TenantMode
metadata: {name: acme-trial}
spec: {tenant: acme, mode: dry-run}
---
kind: TenantMode
metadata: {name: beta}
spec: {tenant: beta, mode: enforce}
"""


def test_grants_to_every_tenants_users_and_dry_run_modes_are_linted(tmp_path: Path) -> None:
    """Issue 22: a ClusterRoleBinding of `system:authenticated` (or of a group every
    tenant's users carry) to a role on resources inside tenants gives every tenant's
    users that access in every other tenant; a TenantMode dry-run forwards a tenant's
    refusals. Both are lint warnings: `check --strict` fails on them."""
    (tmp_path / "p.yaml").write_text(EVERY_TENANT)
    r = _check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if "WARNING" in line]
    every = [line for line in lines if "in force in every tenant" in line]
    assert len(every) == 2, lines
    assert every[0].startswith(
        f"{tmp_path / 'p.yaml'}:13: WARNING: ClusterRoleBinding everyone-reads"
    )
    assert "group 'system:authenticated' (every tenant's users)" in every[0]
    assert "grants configmaps through" in every[0]  # not nodes, not the self review
    assert "ClusterRoleBinding users-read" in every[1]
    assert "group 'users' of every tenant (acme, beta)" in every[1]
    modes = [line for line in lines if "TenantMode" in line]
    assert modes == [
        f"{tmp_path / 'p.yaml'}:45: WARNING: TenantMode acme-trial puts tenant 'acme' in "
        "dry-run: its refusals inside tenant 'acme' (RBAC 403s, rate limits, quotas) are "
        "logged and forwarded, not answered"
    ]
    assert _check(tmp_path, "--strict").returncode == 1

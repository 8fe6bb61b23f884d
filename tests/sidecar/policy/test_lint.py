"""Lint warnings of `sidecar policy check` (they fail the check only with --strict)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

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

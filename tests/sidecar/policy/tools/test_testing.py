"""`sidecar policy test` (runner, failure lines, summary, coverage) and the shipped
`policies/` set, through the real command line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sidecar.cli.policy import validate
from sidecar.policy.tools.testing import run_tests
from tests.rigs import paths

ROOT = paths.ROOT
POLICIES = ROOT / "policies"

ROLES = """\
kind: ClusterRole
metadata: {name: reader}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
- {apiGroups: [""], resources: [configmaps], verbs: [get]}
---
kind: TenantRoleBinding
metadata: {name: readers, tenant: acme}
roleRef: {kind: ClusterRole, name: reader}
subjects:
- {kind: Group, name: readers}
"""

SUITE = """\
kind: PolicyTest
metadata: {name: readers}
cases:
- name: reads pods
  identity: {user: ann, tenant: acme, groups: [readers]}
  request: {method: GET, path: /api/v1/tenants/acme/namespaces/dev/pods}
  expect: allow
- name: wrongly expects to delete pods
  identity: {user: ann, tenant: acme, groups: [readers]}
  request: {method: DELETE, path: /api/v1/tenants/acme/namespaces/dev/pods/p1}
  expect: allow
- name: other tenant is hidden
  identity: {user: ann, tenant: acme, groups: [readers]}
  request: {method: GET, path: /api/v1/tenants/beta/namespaces/dev/pods}
  expect: notfound
"""


def policy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(tmp: Path, roles: str = ROLES, suite: str = SUITE) -> Path:
    (tmp / "roles.yaml").write_text(roles)
    (tmp / "tests").mkdir(exist_ok=True)
    (tmp / "tests" / "suite.yaml").write_text(suite)
    return tmp


def test_shipped_policies_check_and_test_pass() -> None:
    _, problems, cases = validate([str(POLICIES)])
    assert problems == []
    result = policy("test", str(POLICIES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == f"{len(cases)} passed, 0 failed"
    assert "FAIL" not in result.stdout
    assert "untested rule" not in result.stdout  # every shipped grant has a test


def test_shipped_suites_cover_every_layer() -> None:
    bundle, _, cases = validate([str(POLICIES)])
    report = run_tests(bundle, cases)
    outcomes = {r.actual for r in report.results}
    assert outcomes == {"allow", "deny", "filter", "notfound"}
    kinds = {d.kind for d in bundle.documents}
    assert {
        "ClusterRole",
        "TenantRole",
        "Role",
        "ClusterRoleBinding",
        "TenantRoleBinding",
        "RoleBinding",
        "RateLimit",
        "QuotaDefaults",
        "TenantMode",
        "PolicyTest",
    } <= kinds


def test_failing_case_line_summary_and_exit_code(tmp_path: Path) -> None:
    write(tmp_path)
    result = policy("test", str(tmp_path))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    failing = [line for line in lines if "FAIL" in line]
    assert len(failing) == 1
    assert failing[0].startswith(f"{tmp_path}/tests/suite.yaml:8: FAIL readers: ")
    assert "wrongly expects to delete pods: expected allow, got deny (" in failing[0]
    assert 'cannot delete resource "pods"' in failing[0]  # the engine's reason
    assert lines[-1] == "2 passed, 1 failed"


def test_coverage_lists_untested_rules(tmp_path: Path) -> None:
    write(tmp_path)
    suite = SUITE.replace("expect: allow\n- name: other", "expect: deny\n- name: other")
    (tmp_path / "tests" / "suite.yaml").write_text(suite)
    result = policy("test", str(tmp_path))
    assert result.returncode == 0, result.stdout
    assert f"untested rule: {tmp_path}/roles.yaml:5" in result.stdout
    assert f"untested rule: {tmp_path}/roles.yaml:4" not in result.stdout
    assert "1 rule(s) not exercised" in result.stdout
    assert result.stdout.splitlines()[-1] == "3 passed, 0 failed"
    strict = policy("test", "--fail-uncovered", str(tmp_path))
    assert strict.returncode == 1


def test_policy_problems_stop_the_run(tmp_path: Path) -> None:
    write(tmp_path, roles=ROLES.replace("verbs: [get]}", "verbs: [read]}"))
    result = policy("test", str(tmp_path))
    assert result.returncode == 1
    assert f"{tmp_path}/roles.yaml:5: unknown verb 'read'" in result.stdout
    assert "passed" not in result.stdout


def test_no_cases_is_a_failure(tmp_path: Path) -> None:
    (tmp_path / "roles.yaml").write_text(ROLES)
    result = policy("test", str(tmp_path))
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == "0 passed, 0 failed"
    assert "no PolicyTest cases found" in result.stderr


def test_malformed_request_path_fails_the_case_not_the_run(tmp_path: Path) -> None:
    suite = SUITE.replace("/api/v1/tenants/acme/namespaces/dev/pods}", "/api/v1/tenants/A%zz/x}")
    write(tmp_path, suite=suite)
    result = policy("test", str(tmp_path))
    assert result.returncode == 1
    assert re.search(r"reads pods: expected allow, got error \(.+\)", result.stdout)


def test_shipped_policies_can_be_copied_and_extended(tmp_path: Path) -> None:
    """An operator's workflow: copy policies/, add a grant and its test, run both."""
    dest = tmp_path / "policies"
    shutil.copytree(POLICIES, dest)
    (dest / "90-mine.yaml").write_text(ROLES)
    (dest / "tests" / "mine.yaml").write_text(
        SUITE.replace("expect: allow\n- name: other", "expect: deny\n- name: other")
    )
    assert policy("check", str(dest)).returncode == 0
    result = policy("test", str(dest))
    assert result.returncode == 0, result.stdout
    assert "untested rule" in result.stdout
    assert "90-mine.yaml:5" in result.stdout


def test_explain_json_shape() -> None:
    result = policy(
        "explain",
        "--json",
        "--user",
        "bob",
        "--tenant",
        "acme",
        "--group",
        "developers",
        "GET",
        "/api/v1/tenants/acme/namespaces/dev/pods",
        str(POLICIES),
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {
        "target",
        "decision",
        "reason",
        "revision",
        "mode",
        "modeSource",
        "live",
        "modeNote",
    }
    assert set(out["target"]) == {
        "verb",
        "apiGroup",
        "apiVersion",
        "scope",
        "tenant",
        "namespace",
        "resource",
        "subresource",
        "name",
        "resourceRequest",
        "path",
    }
    assert out["decision"] == "allow"
    bundle, _, _ = validate([str(POLICIES)])
    assert out["revision"] == bundle.revision


def test_compile_prints_model_and_policy_lines() -> None:
    result = policy("compile", str(POLICIES))
    assert result.returncode == 0, result.stderr
    assert "[matchers]" in result.stdout
    assert re.search(r"^p, ", result.stdout, re.M)
    assert re.search(r"^g, ", result.stdout, re.M)


def test_an_evaluator_that_raises_fails_the_case_not_the_run(tmp_path: Path) -> None:
    from sidecar.policy.tools.testing import PolicyCase

    write(tmp_path)
    bundle, problems, cases = validate([str(tmp_path)])
    assert problems == []

    def faulty(bundle: object, case: PolicyCase) -> tuple[str, str, str]:
        if case.name == "reads pods":
            raise KeyError("boom")
        return case.expect, "fine", ""

    report = run_tests(bundle, cases, faulty)
    assert report.summary() == "2 passed, 1 failed"
    broken = [r for r in report.results if not r.passed]
    assert broken[0].crashed
    assert broken[0].actual == "error"
    assert "KeyError: 'boom'" in broken[0].failure_line()

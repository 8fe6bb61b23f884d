"""Which refusals a mode may relax (issue 22; DESIGN §5 "Decisions"): the one rule in
`decide.py` (`Verdict.relaxable` / `Verdict.held`), and how `policy explain`, `policy
can-i --list` and `policy test` report the mode in force and what the live request
gets. The live stages are tested in tests/security/test_mode_isolation.py and
tests/system/test_decision_consistency.py (dry-run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.identity import Identity
from sidecar.policy.decide import NO_BODY
from sidecar.policy.kinds.modes import DRY_RUN, ENFORCE, forwards, live
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.tools.explain import explain, explain_verdict
from tests.rigs import paths
from tests.rigs.modes import tenant_modes

ACME_ADMIN = Identity("alice", "acme", ("tenant-admins",), "test")
DEV = Identity("dave", "acme", ("developers",), "test")
OWNER = Identity("oscar", "acme", ("node-owners",), "test")
NOBODY = Identity("nina", "acme", (), "test")
ALLOCATIONS = "/apis/baremetal/v1/tenants/acme/allocations"


@pytest.fixture(scope="module")
def bundle() -> PolicyBundle:
    b, problems = load_bundle([paths.SHIPPED_POLICIES])
    assert problems == []
    return b


# (identity, method, path, object, body, outcome, relaxable, why held)
CASES: list[tuple[Identity, str, str, Any, Any, str, bool, str]] = [
    # RBAC 403s inside the caller's own tenant: relaxable.
    (DEV, "GET", "/api/v1/tenants/acme/namespaces/dev/secrets", None, NO_BODY, "deny", True, ""),
    (NOBODY, "DELETE", "/api/v1/namespaces/dev/pods/p1", None, NO_BODY, "deny", True, ""),
    (NOBODY, "GET", "/api/v1/tenants/acme/namespaces", None, NO_BODY, "deny", True, ""),
    # Another tenant: isolation.
    (ACME_ADMIN, "GET", "/api/v1/tenants/beta/namespaces", None, NO_BODY, "notfound", False,
     "isolation"),
    (DEV, "DELETE", "/api/v1/tenants/beta", None, NO_BODY, "notfound", False, "isolation"),
    # The cluster level: every list across tenants, every cluster-scoped object.
    (DEV, "DELETE", "/api/v1/pods", None, NO_BODY, "notfound", False, "isolation"),
    (OWNER, "GET", "/api/v1/nodes/n1", {"spec": {"owner": "beta"}}, NO_BODY, "notfound", False,
     "concealment"),
    (OWNER, "PUT", "/api/v1/nodes/n1/power", None, NO_BODY, "notfound", False, "concealment"),
    (OWNER, "PATCH", "/api/v1/nodes/n1", {"spec": {"owner": "beta"}}, NO_BODY, "notfound",
     False, "concealment"),
    # Its own Tenant object and its own quota are cluster-scoped: held.
    (DEV, "DELETE", "/api/v1/tenants/acme", None, NO_BODY, "deny", False, "cluster-scoped"),
    (DEV, "PUT", "/apis/quota.sidecar/v1/quotas/acme", None, NO_BODY, "deny", False,
     "cluster-scoped"),
    # Non-resource URLs are in no tenant.
    (NOBODY, "GET", "/metrics", None, NO_BODY, "deny", False, "non-resource"),
    # Access reviews are the same in every mode.
    (DEV, "POST", "/apis/authorization.k8s.io/v1/tenants/acme/subjectaccessreviews", None,
     NO_BODY, "deny", False, "access reviews"),
    # The owner-field rule on writes: allowed by RBAC, refused by the owner rule.
    (ACME_ADMIN, "POST", ALLOCATIONS, None, {"spec": {"owner": "beta"}}, "deny", False,
     "owner fields"),
    (OWNER, "PATCH", "/api/v1/nodes/n1", {"spec": {"owner": "acme"}}, {"spec": {"owner": "beta"}},
     "deny", False, "owner fields"),
    # A write RBAC refuses inside the tenant: relaxable only with its owner left to acme.
    (DEV, "PATCH", f"{ALLOCATIONS}/a1", None, {"spec": {"owner": "beta"}}, "deny", False,
     "owner fields"),
    (DEV, "PATCH", f"{ALLOCATIONS}/a1", None, {"metadata": {"labels": {"a": "b"}}}, "deny", True,
     ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("who", "method", "path", "obj", "body", "outcome", "relaxable", "held"), CASES
)
def test_which_refusals_a_mode_may_relax(
    bundle: PolicyBundle,
    who: Identity,
    method: str,
    path: str,
    obj: Any,
    body: Any,
    outcome: str,
    relaxable: bool,
    held: str,
) -> None:
    v = explain_verdict(bundle, who, method, path, obj, body)
    assert v.outcome == outcome, v.reason
    assert v.relaxable is relaxable, v
    assert (held in v.held) if held else v.held == "", v.held
    assert forwards(v, ENFORCE) is False
    assert forwards(v, DRY_RUN) is relaxable


def test_a_relaxed_write_keeps_the_owner_to_the_callers_tenant(bundle: PolicyBundle) -> None:
    """The developer may not update allocations; relaxed, its body still gets the owner
    rule of an allowed write: an empty owner becomes acme."""
    v = explain_verdict(bundle, DEV, "PUT", f"{ALLOCATIONS}/a1", None, {"spec": {}})
    assert v.outcome == "deny"
    assert v.relaxable
    assert v.body == {"spec": {"owner": "acme"}}
    # Without the body (explain, reviews) the verdict says it must be checked.
    v = explain_verdict(bundle, DEV, "PUT", f"{ALLOCATIONS}/a1")
    assert v.relaxable
    assert v.needs_body
    assert "if its owner fields" in live(v, DRY_RUN)


def test_allowed_verdicts_are_never_marked(bundle: PolicyBundle) -> None:
    v = explain_verdict(bundle, OWNER, "GET", "/api/v1/nodes")
    assert v.outcome == "filter"
    assert not v.relaxable
    assert not v.held
    assert live(v, DRY_RUN) == "forwarded, owner-filtered"


def test_explain_names_the_mode_and_the_live_answer(bundle: PolicyBundle) -> None:
    secrets = "/api/v1/tenants/acme/namespaces/dev/secrets"
    out = explain(bundle, DEV, "GET", secrets)
    assert (out["mode"], out["modeSource"], out["live"]) == ("enforce", "global", "deny")
    out = explain(bundle, DEV, "GET", secrets, global_mode=DRY_RUN)
    assert (out["mode"], out["modeSource"], out["live"]) == ("dry-run", "global", "forwarded")
    assert out["modeNote"] == "dry-run (global): would deny, forwarded"
    out = explain(bundle, OWNER, "GET", "/api/v1/nodes/n1", global_mode=DRY_RUN)
    assert out["live"] == "notfound"
    assert "not relaxed: concealment" in out["modeNote"]
    # The shipped sandbox TenantMode overrides the global mode for its tenant.
    sandbox = Identity("sam", "sandbox", (), "test")
    out = explain(bundle, sandbox, "GET", "/api/v1/namespaces/dev/pods")
    assert (out["mode"], out["modeSource"], out["live"]) == (
        "dry-run",
        "tenant sandbox",
        "forwarded",
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=paths.ROOT,
        check=False,
    )


@pytest.fixture
def acme_dry_run(tmp_path: Path) -> Path:
    d = tmp_path / "policies"
    shutil.copytree(paths.SHIPPED_POLICIES, d)
    (d / "85-acme.yaml").write_text(tenant_modes(("acme",)))
    return d


def test_explain_cli_prints_the_mode_line(acme_dry_run: Path) -> None:
    secrets = "/api/v1/tenants/acme/namespaces/dev/secrets"
    r = _cli("explain", "--user", "dave", "--tenant", "acme", "--group", "developers",
             "GET", secrets, str(acme_dry_run))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "mode:     dry-run (tenant acme): would deny, forwarded" in r.stdout
    r = _cli("explain", "--json", "--user", "oscar", "--tenant", "acme", "--group",
             "node-owners", "PATCH", "/api/v1/nodes/n1", str(acme_dry_run))  # fmt: skip
    out = json.loads(r.stdout)
    assert (out["decision"], out["mode"], out["live"]) == ("notfound", "dry-run", "notfound")
    r = _cli("explain", "--mode", "dry-run", "--user", "bob", "--tenant", "beta",
             "GET", "/api/v1/namespaces/dev/pods", str(acme_dry_run))  # fmt: skip
    assert "mode:     dry-run (global): would deny, forwarded" in r.stdout
    r = _cli("explain", "--user", "bob", "--tenant", "beta",
             "GET", "/api/v1/namespaces/dev/pods", str(acme_dry_run))  # fmt: skip
    assert "mode:     enforce (global): denied (HTTP 403)" in r.stdout


def test_can_i_list_names_the_mode(acme_dry_run: Path) -> None:
    r = _cli("can-i", "--list", "--user", "dave", "--tenant", "acme", str(acme_dry_run))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("mode: dry-run (tenant acme): refusals inside tenant acme")
    r = _cli("can-i", "--list", "--json", "--user", "bob", "--tenant", "beta",
             "--mode", "dry-run", str(acme_dry_run))  # fmt: skip
    out = json.loads(r.stdout)
    assert (out["mode"], out["modeSource"]) == ("dry-run", "global")


def test_policy_test_lists_the_cases_a_mode_forwards(acme_dry_run: Path) -> None:
    r = _cli("test", str(acme_dry_run))
    assert r.returncode == 0, r.stdout
    relaxed = [line for line in r.stdout.splitlines() if ": live: " in line]
    assert relaxed, r.stdout
    assert all("dry-run (tenant acme)" in line for line in relaxed)
    assert "refused case(s) are forwarded live by their caller's mode" in r.stdout
    # The shipped tree alone: no case's tenant is in dry-run.
    r = _cli("test", str(paths.SHIPPED_POLICIES))
    assert ": live: " not in r.stdout

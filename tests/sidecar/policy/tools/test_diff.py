"""`sidecar policy diff`: exactness on generated policy pairs, git sources, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.core.identity import Identity
from sidecar.core.target import parse_target
from sidecar.policy.decide import decide
from sidecar.policy.source.bundle import load_bundle
from sidecar.policy.tools.diff import diff_bundles

ROOT = Path(__file__).resolve().parents[4]

ROLE = """\
kind: {kind}
metadata: {{name: {name}{meta}}}
rules:
{rules}
"""
BINDING = """\
kind: {kind}
metadata: {{name: {name}{meta}}}
roleRef: {{kind: {rkind}, name: {role}}}
subjects:
- {{kind: {skind}, name: {sname}{stenant}}}
"""

VERBS = ["get", "list", "create", "delete", "watch"]
rule_st = st.fixed_dictionaries(
    {
        "groups": st.sampled_from([[""], ["*"], ["compute"]]),
        "resources": st.sampled_from(
            [["pods"], ["*"], ["nodes"], ["pods", "nodes"], ["servers/tags"], ["*/tags"]]
        ),
        "verbs": st.lists(st.sampled_from([*VERBS, "*"]), min_size=1, max_size=2, unique=True),
        "names": st.sampled_from([None, ["n1"]]),
        "owner": st.booleans(),
    }
)
# (binding kind, tenant, namespace); subjects of acme only, or cluster-wide for beta.
binding_st = st.tuples(
    st.sampled_from(["ClusterRoleBinding", "TenantRoleBinding", "RoleBinding"]),
    st.sampled_from(["alice", "devs"]),
    st.sampled_from(["dev", "qa"]),
    st.lists(rule_st, min_size=1, max_size=2),
)


def _rules(rules: list[dict[str, object]]) -> str:
    out = []
    for r in rules:
        verbs = r["verbs"]
        assert isinstance(verbs, list)
        if r["owner"]:
            verbs = [v for v in verbs if v != "watch"]
            if not verbs:
                verbs = ["get"]
        text = (
            f"- apiGroups: {json.dumps(r['groups'])}\n  resources: {json.dumps(r['resources'])}\n"
        )
        text += f"  verbs: {json.dumps(verbs)}\n"
        if r["names"]:
            text += f"  resourceNames: {json.dumps(r['names'])}\n"
        if r["owner"]:
            text += "  when: owner\n"
        out.append(text)
    return "".join(out)


def _write(root: Path, bindings: list[tuple[str, str, str, list[dict[str, object]]]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    docs = []
    for i, (kind, who, ns, rules) in enumerate(bindings):
        skind, sname = ("Group", "devs") if who == "devs" else ("User", "alice")
        if kind == "ClusterRoleBinding":
            docs.append(ROLE.format(kind="ClusterRole", name=f"r{i}", meta="", rules=_rules(rules)))
            docs.append(
                BINDING.format(
                    kind=kind,
                    name=f"b{i}",
                    meta="",
                    rkind="ClusterRole",
                    role=f"r{i}",
                    skind=skind,
                    sname=sname,
                    stenant=", tenant: acme",
                )
            )
            continue
        meta = ", tenant: acme" + (f", namespace: {ns}" if kind == "RoleBinding" else "")
        docs.append(
            ROLE.format(kind="TenantRole", name=f"r{i}", meta=", tenant: acme", rules=_rules(rules))
        )
        docs.append(
            BINDING.format(
                kind=kind,
                name=f"b{i}",
                meta=meta,
                rkind="TenantRole",
                role=f"r{i}",
                skind=skind,
                sname=sname,
                stenant="",
            )
        )
    (root / "p.yaml").write_text(
        "---\n".join(docs) or "kind: QuotaDefaults\nmetadata: {name: d}\nspec: {hard: {}}\n"
    )


PATHS = [
    ("GET", "/api/v1/tenants/acme/namespaces/{ns}/pods"),
    ("GET", "/api/v1/tenants/acme/namespaces/{ns}/pods/n1"),
    ("DELETE", "/api/v1/tenants/acme/namespaces/{ns}/pods/n2"),
    ("POST", "/api/v1/tenants/acme/namespaces/{ns}/pods"),
    ("GET", "/api/v1/tenants/{t}/namespaces/{ns}/pods?watch=1"),
    ("GET", "/api/v1/nodes/n1"),
    ("GET", "/api/v1/nodes"),
    ("DELETE", "/api/v1/nodes/n2"),
    ("GET", "/api/v1/pods"),
    ("GET", "/apis/compute/v1/tenants/{t}/namespaces/{ns}/servers/n1/tags"),
    ("POST", "/apis/compute/v1/tenants/{t}/namespaces/{ns}/servers/n1/tags"),
    ("GET", "/apis/compute/v1/tenants/{t}/namespaces/{ns}/servers/n1/status"),
    ("GET", "/api/v1/tenants/{t}/pods"),
]
IDENTITIES = [Identity("alice", "acme", (), "t"), Identity("zed", "acme", ("devs",), "t")]


def _access(bundle: object, identity: Identity, method: str, path: str) -> tuple[str, str]:
    raw, _, query = path.partition("?")
    target = parse_target(method, raw, query)

    def outcome(obj: object) -> str:
        v = decide(bundle, identity, target, obj)  # type: ignore[arg-type]
        return v.outcome if v.allowed else "refused"

    return outcome(None), outcome({"spec": {"owner": identity.tenant}})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    old=st.lists(binding_st, max_size=3),
    new=st.lists(binding_st, max_size=3),
    shared=st.lists(binding_st, max_size=2),
)
def test_diff_is_exact(tmp_path_factory: pytest.TempPathFactory, old, new, shared) -> None:  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("pair")
    _write(base / "old", shared + old)
    _write(base / "new", shared + new)
    ob, op = load_bundle([base / "old"])
    nb, np_ = load_bundle([base / "new"])
    assert not op, op
    assert not np_, np_
    d = diff_bundles(ob, nb)
    for identity in IDENTITIES:
        for method, template in PATHS:
            for t in ("acme", "beta"):
                for ns in ("dev", "qa", "other"):
                    path = template.format(t=t, ns=ns)
                    raw, _, query = path.partition("?")
                    target = parse_target(method, raw, query)
                    changed = _access(ob, identity, method, path) != _access(
                        nb, identity, method, path
                    )
                    covering = [c for c in d.changes if c.covers(identity, target)]
                    assert changed == bool(covering), (identity, method, path, covering)


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


SIMPLE = """\
kind: ClusterRole
metadata: {name: reader}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
---
kind: RoleBinding
metadata: {name: readers, tenant: acme, namespace: dev}
roleRef: {kind: ClusterRole, name: reader}
subjects:
- {kind: User, name: alice}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "rbac.yaml").write_text(SIMPLE)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return tmp_path


def test_git_ref_against_working_tree(repo: Path) -> None:
    same = _run("diff", "git:HEAD:policies", "policies", cwd=repo)
    assert same.returncode == 0, same.stderr
    assert "no change" in same.stdout
    (repo / "policies" / "rbac.yaml").write_text(
        SIMPLE.replace("[get, list]", "[get, list, delete]")
    )
    changed = _run("diff", "--json", "git:HEAD", "policies", cwd=repo)
    assert changed.returncode == 1, changed.stderr
    out = json.loads(changed.stdout)
    [change] = out["changes"]
    assert change["change"] == "gained"
    assert change["verb"] == "delete"
    assert change["resource"] == "pods"
    assert change["where"] == ["namespace acme/dev"]
    assert change["subject"] == "User alice (tenant acme)"
    assert "RoleBinding acme/dev/readers → ClusterRole reader" in change["via"]
    lost = _run("diff", "policies", "git:HEAD:policies", cwd=repo)
    assert lost.returncode == 1
    assert "- delete pods (core) in namespace acme/dev" in lost.stdout
    md = _run("diff", "--markdown", "git:HEAD:policies", "policies", cwd=repo)
    assert md.returncode == 1
    assert "| **gained** | `delete pods (core)` |" in md.stdout


def test_wildcards_stay_wildcards(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "p.yaml").write_text(SIMPLE)
    (tmp_path / "new" / "p.yaml").write_text(
        SIMPLE.replace('[""]\n  resources: [pods]', '["*"]\n  resources: ["*"]')
    )
    r = _run("diff", str(tmp_path / "old"), str(tmp_path / "new"))
    assert r.returncode == 1
    assert "+ get, list * (any group) in namespace acme/dev" in r.stdout
    assert "already granted before: get pods (core); list pods (core)" in r.stdout
    assert "configmaps" not in r.stdout


def test_rate_limit_and_quota_changes(tmp_path: Path) -> None:
    for side, rate, hard in (("old", 5, 10), ("new", 7, 12)):
        (tmp_path / side).mkdir()
        (tmp_path / side / "p.yaml").write_text(
            f"kind: RateLimit\nmetadata: {{name: acme}}\nspec: {{tenant: acme, rate: {rate}, burst: 10}}\n"
            f"---\nkind: TenantResourceQuota\nmetadata: {{name: acme, tenant: acme}}\n"
            f"spec: {{hard: {{servers: {hard}}}}}\n"
        )
    r = _run("diff", str(tmp_path / "old"), str(tmp_path / "new"))
    assert r.returncode == 1
    assert "rate limit of tenant acme: 5/s burst 10" in r.stdout
    assert "→ 7/s burst 10" in r.stdout
    assert "quota of tenant acme: servers 10 → 12" in r.stdout


def test_a_tenant_mode_is_a_change(repo: Path) -> None:
    """Issue 22: a pull request adding `TenantMode acme dry-run` printed "no change of
    effective access" and exited 0. A mode change is a change of behaviour."""
    (repo / "policies" / "modes.yaml").write_text(
        "kind: TenantMode\nmetadata: {name: acme}\nspec: {tenant: acme, mode: dry-run}\n"
    )
    r = _run("diff", "git:HEAD:policies", "policies", cwd=repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no change" not in r.stdout.lower()
    assert "~ mode of tenant acme: the global mode (config `mode`) → dry-run" in r.stdout
    out = json.loads(_run("diff", "--json", "git:HEAD", "policies", cwd=repo).stdout)
    assert out["changed"] is True
    assert out["modes"] == [{"tenant": "acme", "old": None, "new": "dry-run"}]
    md = _run("diff", "--markdown", "git:HEAD:policies", "policies", cwd=repo)
    assert md.returncode == 1
    assert "No change of effective access" not in md.stdout
    assert "- mode of tenant acme: the global mode (config `mode`) → dry-run" in md.stdout
    # dry-run → enforce, and back to the global mode, are changes too.
    for side, mode in (("old", "dry-run"), ("policies", "enforce")):
        (repo / side).mkdir(exist_ok=True)
        (repo / side / "modes.yaml").write_text(
            f"kind: TenantMode\nmetadata: {{name: acme}}\nspec: {{tenant: acme, mode: {mode}}}\n"
        )
    (repo / "old" / "rbac.yaml").write_text(SIMPLE)
    r = _run("diff", "old", "policies", cwd=repo)
    assert r.returncode == 1
    assert "mode of tenant acme: dry-run → enforce" in r.stdout
    r = _run("diff", "old", "git:HEAD:policies", cwd=repo)
    assert "mode of tenant acme: dry-run → the global mode (config `mode`)" in r.stdout
    # The shipped tree against itself: no change, exit 0.
    assert _run("diff", "policies", "policies", cwd=repo).returncode == 0


@pytest.mark.parametrize(
    ("old", "needle"),
    [
        ("git:no-such-ref:policies", "git ref 'no-such-ref' does not exist"),
        ("git:--output=/tmp/x:policies", "git ref '--output=/tmp/x' does not exist"),
        ("git:HEAD:../outside", "is outside the repository"),
        ("git:HEAD:/etc", "is outside the repository"),
        ("missing-dir", "no such policy directory"),
        ("broken", "does not validate: "),
    ],
)
def test_bad_sources_exit_2_with_one_line(repo: Path, old: str, needle: str) -> None:
    (repo / "broken").mkdir()
    (repo / "broken" / "p.yaml").write_text(
        SIMPLE.replace("metadata: {name: reader}", "metadata: {name: other}")
    )
    r = _run("diff", old, "policies", cwd=repo)
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr

"""`sidecar policy who-can` and `sidecar policy can-i --list` against the shipped policies
(the CLI as a subprocess; can-i compared with the in-process rules review)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.app import build_app
from sidecar.config.settings import load_config
from tests.rigs.processes import free_port

ROOT = Path(__file__).resolve().parents[4]
POLICIES = str(ROOT / "policies")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def _who(*args: str) -> list[dict[str, Any]]:
    r = _run("who-can", *args, "--json", POLICIES)
    assert r.returncode == 0, r.stderr
    found: list[dict[str, Any]] = json.loads(r.stdout)
    return found


def test_who_can_names_subjects_and_grants() -> None:
    found = {
        h["subject"]: h for h in _who("delete", "pods", "--tenant", "acme", "--namespace", "dev")
    }
    assert "Group developers (tenant acme)" in found
    assert (
        "RoleBinding acme/dev/developers → ClusterRole developer"
        in found["Group developers (tenant acme)"]["via"]
    )
    assert "Group tenant-admins (tenant acme)" in found
    assert "Group cluster-admins (tenant system)" in found
    assert "Group viewers (tenant acme)" not in found  # read-only
    assert not [s for s in found if "tenant beta" in s]  # beta's admins stay in beta
    # Another namespace: the RoleBinding of dev is not in force there.
    prod = {h["subject"] for h in _who("delete", "pods", "--tenant", "acme", "--namespace", "prod")}
    assert "Group developers (tenant acme)" not in prod


def test_who_can_impersonate() -> None:
    """The impersonation attributes are resources who-can knows, though no rule of the
    shipped policies names them (the admins hold them through `*`)."""
    acme = {h["subject"] for h in _who("impersonate", "users", "--tenant", "acme")}
    assert "Group tenant-admins (tenant acme)" in acme
    assert "Group cluster-admins (tenant system)" in acme
    assert "Group developers (tenant acme)" not in acme
    assert not [s for s in acme if "tenant beta" in s]


def test_who_can_marks_owner_only_grants() -> None:
    found = {h["subject"]: h for h in _who("get", "nodes", "--name", "n1")}
    assert found["Group node-owners (tenant acme)"]["ownerOnly"] is True
    assert found["Group cluster-admins (tenant system)"]["ownerOnly"] is False
    text = _run("who-can", "list", "nodes", POLICIES).stdout
    assert "Group node-owners (tenant acme) [owner-only]" in text


@pytest.mark.parametrize("verb", ["patch", "update", "get"])
def test_who_can_lists_owner_only_grants_on_subresources(verb: str) -> None:
    """Issue 22: `who-can patch nodes/power` (no --name: "some node") left the node
    owners out, so a review of who may power nodes on missed them."""
    found = {h["subject"]: h for h in _who(verb, "nodes/power")}
    assert found["Group node-owners (tenant acme)"]["ownerOnly"] is True, found
    assert "node-owner" in found["Group node-owners (tenant acme)"]["via"]
    assert found["Group cluster-admins (tenant system)"]["ownerOnly"] is False
    text = _run("who-can", verb, "nodes", POLICIES).stdout
    assert "Group node-owners (tenant acme) [owner-only]" in text
    # Verbs no owner rule grants stay out; so do objects the rule does not name.
    assert "node-owners" not in _run("who-can", "delete", "nodes/power", POLICIES).stdout
    assert "node-owners" not in _run("who-can", verb, "persistentvolumes", POLICIES).stdout


def test_who_can_resource_names_and_groups() -> None:
    named = {h["subject"] for h in _who("get", "secrets", "--tenant", "acme", "--namespace", "dev",
                                         "--name", "app-config")}  # fmt: skip
    other = {h["subject"] for h in _who("get", "secrets", "--tenant", "acme", "--namespace", "dev",
                                         "--name", "db-password")}  # fmt: skip
    assert "Group developers (tenant acme)" in named
    assert "Group developers (tenant acme)" not in other
    servers = {h["subject"] for h in _who("create", "servers.compute", "--tenant", "acme",
                                           "--namespace", "dev")}  # fmt: skip
    assert "Group developers (tenant acme)" in servers


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("frob", "pods"), "unknown verb 'frob'"),
        (("get", "podz"), "unknown resource 'podz'"),
        (("get", "pods.nosuchgroup"), "unknown resource 'pods.nosuchgroup'"),
        (("get", "nodes", "--namespace", "dev", "--tenant", "acme"), "cluster-scoped"),
        (("get", "pods", "--tenant", "Not_A_Tenant"), "bad --tenant"),
    ],
)
def test_who_can_bad_input(args: tuple[str, ...], needle: str) -> None:
    r = _run("who-can", *args, POLICIES)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_who_can_broken_tree(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("kind: ClusterRole\nmetadata: {name: x}\nrules: 3\n")
    r = _run("who-can", "get", "pods", str(tmp_path))
    assert r.returncode == 2
    assert "does not validate" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


async def test_can_i_list_is_the_rules_review(tmp_path: Path, aiohttp_client: Any) -> None:
    (tmp_path / "tokens.yaml").write_text(
        yaml.safe_dump(
            [{"token": "t-dave", "user": "dave", "tenant": "acme", "groups": ["developers"]}]
        )
    )
    raw = {
        "upstream": f"http://127.0.0.1:{free_port()}",
        "policies": POLICIES,
        "identity": {"tokenFile": str(tmp_path / "tokens.yaml")},
        "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
        "audit": {"path": str(tmp_path / "audit.log")},
        "reload": {"enabled": False},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    client = await aiohttp_client(build_app(load_config(tmp_path / "config.yaml", env={})))
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
              "spec": {"namespace": "dev"}}  # fmt: skip
    resp = await client.post(
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        json=review,
        headers={"Authorization": "Bearer t-dave"},
    )
    assert resp.status == 201
    status = (await resp.json())["status"]
    r = _run("can-i", "--list", "--user", "dave", "--tenant", "acme", "--group", "developers",
             "--namespace", "dev", "--json", POLICIES)  # fmt: skip
    assert r.returncode == 0, r.stderr
    mine = json.loads(r.stdout)
    assert mine["resourceRules"] == status["resourceRules"]
    assert mine["nonResourceRules"] == status["nonResourceRules"]
    assert any("secrets" in rule["resources"] for rule in mine["resourceRules"])
    text = _run("can-i", "--list", "--user", "oscar", "--tenant", "acme", "--group",
                "node-owners", POLICIES).stdout  # fmt: skip
    assert "nodes" in text
    assert "[owner-only: spec.owner]" in text

"""Near misses in `sidecar policy explain` (text and --json), operators only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
POLICIES = str(ROOT / "policies")


def _explain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", "explain", *args, POLICIES],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip


def _misses(*args: str) -> list[dict[str, Any]]:
    r = _explain("--json", *args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["decision"] in ("deny", "notfound")
    misses: list[dict[str, Any]] = out["nearMisses"]
    assert len(misses) <= 3
    return misses


DAVE = ("--user", "dave", "--tenant", "acme", "--group", "developers")


def test_namespace_difference() -> None:
    misses = _misses(*DAVE, "DELETE", "/api/v1/tenants/acme/namespaces/prod/pods/p1")
    first = misses[0]
    assert "RoleBinding acme/dev/developers → ClusterRole developer" in first["via"]
    assert first["differs"] == [
        "namespace: the binding is in force in namespace acme/dev, the request is in "
        "namespace acme/prod"
    ]


def test_name_verb_group_and_owner_differences() -> None:
    secrets = _misses(*DAVE, "GET", "/api/v1/tenants/acme/namespaces/dev/secrets/db")
    assert secrets[0]["differs"] == ["name: the rule is limited to app-config, not db"]
    bays = _misses(*DAVE, "DELETE", "/apis/container/v1/tenants/acme/namespaces/dev/bays")
    assert bays[0]["differs"] == [
        "verb: the rule grants get, list, watch, create, delete, not deletecollection"
    ]
    group = _misses(*DAVE, "GET", "/apis/other/v1/tenants/acme/namespaces/dev/bays")
    assert "API group: the rule names 'container', not 'other'" in group[0]["differs"]
    oscar = ("--user", "oscar", "--tenant", "acme", "--group", "node-owners")
    owned = _misses(*oscar, "--object", '{"spec": {"owner": "beta"}}', "GET", "/api/v1/nodes/n1")
    assert owned[0]["differs"] == ["owner: the rule grants only objects whose spec.owner is 'acme'"]
    delete = _misses(*oscar, "DELETE", "/api/v1/nodes/n1")
    assert delete[0]["differs"] == [
        "verb: the rule grants get, list, watch, update, patch, not delete"
    ]


def test_text_output_and_nothing_for_allowed_or_strangers() -> None:
    text = _explain(*DAVE, "GET", "/api/v1/tenants/acme/namespaces/dev/secrets/db").stdout
    assert "near miss: RoleBinding acme/dev/developers-app-config" in text
    assert "    name: the rule is limited to app-config, not db" in text
    allowed = json.loads(
        _explain("--json", *DAVE, "GET", "/api/v1/tenants/acme/namespaces/dev/pods").stdout
    )
    assert allowed["decision"] == "allow"
    assert "nearMisses" not in allowed
    # A caller with no binding: nothing to show, and never another subject's grants.
    assert (
        _misses(
            "--user", "zed", "--tenant", "beta", "GET", "/api/v1/tenants/beta/namespaces/x/pods"
        )
        == []
    )

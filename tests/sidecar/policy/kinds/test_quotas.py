"""Quota policy kinds: valid documents, and every bad input a file:line problem (the
meters and quantities are in tests/sidecar/services/quota/test_meters.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.policy.kinds.quotas import parse_quotas
from sidecar.policy.source.files import load_documents


def parse(tmp_path: Path, text: str) -> tuple[object, list[str]]:
    (tmp_path / "q.yaml").write_text(text)
    result = load_documents([tmp_path])
    policy, problems = parse_quotas(result.documents)
    return policy, [str(p) for p in problems]


def test_valid_documents(tmp_path: Path) -> None:
    policy, problems = parse(
        tmp_path,
        """
kind: QuotaDefaults
metadata: {name: d}
spec: {hard: {servers: 10, bays: 5, requests.cpu: "8", requests.memory: 16Gi}}
---
kind: TenantResourceQuota
metadata: {name: acme, tenant: acme}
spec: {hard: {servers: 100, requests.cpu: 500m}}
---
kind: ResourceQuota
metadata: {name: dev, tenant: acme, namespace: dev}
spec: {hard: {servers: 2}}
""",
    )
    assert problems == []
    limits, source = policy.tenant_limits("acme")  # type: ignore[attr-defined]
    assert limits == {
        "servers": 100,
        "bays": 5,
        "requests.cpu": 500,
        "requests.memory": 16 * 1024**3,
    }
    assert source == {
        "servers": "file",
        "bays": "default",
        "requests.cpu": "file",
        "requests.memory": "default",
    }
    assert policy.tenant_limits("beta")[1]["servers"] == "default"  # type: ignore[attr-defined]
    assert policy.namespace_limits("acme", "dev") == {"servers": 2}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("hard", "line", "fragment"),
    [
        ("{servers: -1}", 4, "must not be negative"),
        ("{servers: 1.5}", 4, "must be an integer"),
        ('{servers: "ten"}', 4, "must be an integer"),
        ("{widgets: 3}", 4, "unknown quota resource 'widgets'"),
        ("{requests.cpu: lots}", 4, "does not parse"),
        ('{requests.memory: "-1Gi"}', 4, "negative"),
        ('{requests.memory: "0.5"}', 4, "whole number of bytes"),
        ("{servers: true}", 4, "must be a number"),
    ],
)
def test_bad_limits_have_file_and_line(tmp_path: Path, hard: str, line: int, fragment: str) -> None:
    _, problems = parse(
        tmp_path,
        f"""kind: QuotaDefaults
metadata: {{name: d}}
spec:
  hard: {hard}
""",
    )
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{tmp_path / 'q.yaml'}:{line}: ")
    assert fragment in problems[0]


def test_scope_problems(tmp_path: Path) -> None:
    _, problems = parse(
        tmp_path,
        """kind: TenantResourceQuota
metadata: {name: x}
spec: {hard: {servers: 1}}
---
kind: ResourceQuota
metadata: {name: x, tenant: acme}
spec: {hard: {servers: 1}}
---
kind: QuotaDefaults
metadata: {name: a}
spec: {hard: {servers: 1}, soft: 2}
---
kind: QuotaDefaults
metadata: {name: b}
spec: {hard: {servers: 1}}
""",
    )
    text = "\n".join(problems)
    assert "needs metadata.tenant" in text
    assert "needs metadata.namespace" in text
    assert "unknown field spec.soft" in text
    assert "a second QuotaDefaults" in text

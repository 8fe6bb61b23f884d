"""Quota policy kinds (file:line problems) and the meters (quantities, charges)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.policy.files import load_documents
from sidecar.policy.quotas import parse_quotas
from sidecar.quantities import (
    QuantityError,
    format_units,
    parse_quantity,
    to_units,
    tracked_for,
)
from sidecar.quota.meters import charge_for


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
    "hard, line, fragment",
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


@pytest.mark.parametrize(
    "text, value",
    [
        ("500m", "0.5"),
        ("2", "2"),
        ("2Gi", str(2 * 1024**3)),
        ("1k", "1000"),
        ("1e3", "1000"),
        ("1.5Mi", str(int(1.5 * 1024**2))),
        ("100n", "0.0000001"),
    ],
)
def test_quantities(text: str, value: str) -> None:
    from decimal import Decimal

    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize(
    "bad", ["", "abc", "1.2.3", "5Qi", "-1", "1e", "Gi", "1e3Gi", None, True, [1], float("nan")]
)
def test_bad_quantities(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_units_round_trip() -> None:
    assert to_units("requests.cpu", "250m") == 250
    assert to_units("requests.cpu", "0.0001") == 1  # rounded up, as Kubernetes does
    assert format_units("requests.cpu", 1500) == "1500m"
    assert format_units("requests.cpu", 2000) == "2"
    assert format_units("requests.memory", 16 * 1024**3) == "16Gi"
    assert format_units("servers", 4) == 4


def test_charge_sums_container_requests() -> None:
    pod = {
        "spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": 1}}},
                {"name": "c"},
            ]
        }
    }
    assert charge_for("pods", pod) == {
        "pods": 1,
        "requests.cpu": 1250,
        "requests.memory": 64 * 1024**2,
    }
    deploy = {
        "spec": {
            "replicas": 3,
            "template": {"spec": {"containers": [{"resources": {"requests": {"cpu": "100m"}}}]}},
        }
    }
    assert charge_for("deployments", deploy) == {"deployments": 1, "requests.cpu": 300}
    assert charge_for("servers", {"metadata": {"name": "x"}}) == {"servers": 1}


@pytest.mark.parametrize(
    "body",
    [
        {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}},
        {"spec": {"containers": "no"}},
        {"spec": {"containers": [{"resources": {"requests": ["cpu"]}}]}},
        {"spec": {"replicas": -1, "template": {"spec": {"containers": []}}}},
    ],
)
def test_bad_charges(body: dict[str, object]) -> None:
    with pytest.raises(QuantityError):
        charge_for("pods", body)


def test_tracked_table() -> None:
    servers = tracked_for("compute", "servers")
    assert servers is not None and servers.list_path() == "/apis/compute/v1/servers"
    assert servers.list_path("acme") == "/apis/compute/v1/tenants/acme/servers"
    pods = tracked_for("", "pods")
    assert pods is not None and pods.list_path() == "/api/v1/pods"
    assert tracked_for("other", "servers") is None
    alloc = tracked_for("baremetal", "allocations")
    assert alloc is not None and not alloc.namespaced

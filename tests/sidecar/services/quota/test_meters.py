"""The quota meters: quantities (parse, units, round trip) and the charges a request body
makes (sidecar/core/quantities.py, sidecar/services/quota/meters.py)."""

from __future__ import annotations

import pytest

from sidecar.core.quantities import (
    QuantityError,
    format_units,
    parse_quantity,
    to_units,
    tracked_for,
)
from sidecar.services.quota.meters import charge_for


@pytest.mark.parametrize(
    ("text", "value"),
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


def test_numbers_as_a_streaming_parser_reads_them_are_quantities() -> None:
    """ijson (reconcile's streamed pages) reads `0.5` as Decimal, not float: the same value."""
    from decimal import Decimal

    assert to_units("requests.cpu", Decimal("0.5")) == to_units("requests.cpu", 0.5) == 500
    assert to_units("requests.memory", Decimal("1E+3")) == 1000
    for bad in (Decimal("NaN"), Decimal("Infinity"), Decimal("-1"), Decimal("1E+400")):
        with pytest.raises(QuantityError):
            parse_quantity(bad)


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
    assert servers is not None
    assert servers.list_path() == "/apis/compute/v1/servers"
    assert servers.list_path("acme") == "/apis/compute/v1/tenants/acme/servers"
    pods = tracked_for("", "pods")
    assert pods is not None
    assert pods.list_path() == "/api/v1/pods"
    assert tracked_for("other", "servers") is None
    alloc = tracked_for("baremetal", "allocations")
    assert alloc is not None
    assert not alloc.namespaced

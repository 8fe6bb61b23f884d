"""The operational gauges (sidecar/edge/ops_metrics.py) from the services' state:
open watches per tenant with the bounded label set (made-up tenants past the cap are
`_other`, a tenant's series goes back to 0), the policy source's state, and the ledger
following its readiness check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families

from sidecar.core.identity import Identity
from sidecar.edge.health import Readiness
from sidecar.edge.ops_metrics import OpsGauges
from sidecar.services.metrics import Metrics


@dataclass
class _Ctx:
    identity: Identity | None


@dataclass
class _Watch:
    ctx: _Ctx


@dataclass
class _Relay:
    watches: dict[object, _Watch] = field(default_factory=dict)


@dataclass
class _Store:
    last_error: list[Any] = field(default_factory=list)
    loaded_at: float = 1234.0


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _watchers(relay: _Relay, tenants: list[str | None]) -> None:
    relay.watches = {
        object(): _Watch(_Ctx(Identity("u", t) if t is not None else None)) for t in tenants
    }


async def test_open_watches_per_tenant_are_bounded_and_go_back_to_zero() -> None:
    metrics = Metrics(max_tenant_labels=2)
    relay, store = _Relay(), _Store()
    OpsGauges(metrics, cast(Any, store), cast(Any, relay), Readiness(metrics))
    _watchers(relay, ["acme", "acme", "beta", "made-up-1", "made-up-2", None])
    samples = _samples(metrics)  # a scrape refreshes first
    watches = {
        dict(labels)["tenant"]: v
        for (n, labels), v in samples.items()
        if n == "sidecar_watches_open"
    }
    assert watches == {"acme": 2, "beta": 1, "_other": 2, "_none": 1}
    _watchers(relay, ["beta"])
    watches = {
        dict(labels)["tenant"]: v
        for (n, labels), v in _samples(metrics).items()
        if n == "sidecar_watches_open"
    }
    assert watches == {"acme": 0, "beta": 1, "_other": 0, "_none": 0}


async def test_the_policy_source_and_the_ledger_gauges() -> None:
    metrics = Metrics()
    store = _Store()
    readiness = Readiness(metrics)
    ledger_ok = [True]

    async def ledger() -> tuple[bool, str]:
        return ledger_ok[0], "ledger"

    readiness.add("ledger", ledger)
    ops = OpsGauges(metrics, cast(Any, store), cast(Any, _Relay()), readiness)
    await ops.check()
    samples = _samples(metrics)
    assert samples[("sidecar_ledger_up", ())] == 1
    assert samples[("sidecar_policy_source_ok", ())] == 1
    assert samples[("sidecar_policy_loaded_timestamp_seconds", ())] == 1234.0
    assert ("sidecar_tls_certificate_expiry_timestamp_seconds", ()) not in samples
    ledger_ok[0] = False
    store.last_error = ["a refused change"]
    await ops.check()
    samples = _samples(metrics)
    assert samples[("sidecar_ledger_up", ())] == 0
    assert samples[("sidecar_ready_check", (("check", "ledger"),))] == 0
    assert samples[("sidecar_policy_source_ok", ())] == 0

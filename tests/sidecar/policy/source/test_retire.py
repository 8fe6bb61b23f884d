"""Retiring a replaced policy: no reference cycles (the reloader freezes policies out
of the cyclic collector, so only reference counting can free them), piece-by-piece
teardown of what the old bundle alone owns, and never while a request still uses it."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from sidecar.config.settings import ReloadConfig
from sidecar.core.identity import Identity
from sidecar.core.target import parse_target
from sidecar.policy.decide import decide
from sidecar.policy.source import reload as reload_module
from sidecar.policy.source import retire
from sidecar.policy.source.bundle import load_bundle
from sidecar.policy.source.reload import Reloader
from sidecar.policy.source.store import PolicyStore
from sidecar.services.metrics import Metrics
from tests.rigs import paths
from tests.rigs.waiting import eventually

ROOT = paths.ROOT
ALICE = Identity("alice", "acme", ("tenant-admins",))
PODS = parse_target("GET", "/api/v1/tenants/acme/namespaces/dev/pods")

ROLE = """\
kind: ClusterRole
metadata: {{name: {name}}}
rules:
- {{apiGroups: [""], resources: [pods], verbs: [get, list]}}
---
kind: TenantRoleBinding
metadata: {{name: b, tenant: acme}}
roleRef: {{kind: ClusterRole, name: {name}}}
subjects:
- {{kind: Group, name: tenant-admins}}
"""


def test_a_bundle_has_no_reference_cycles() -> None:
    gc.collect()
    gc.disable()
    try:
        bundle, problems = load_bundle([ROOT / "policies"])
        assert problems == []
        assert decide(bundle, ALICE, PODS).outcome == "allow"
        engine = weakref.ref(bundle.engine)
        del bundle
        assert engine() is None, "the engine outlived its bundle: a reference cycle"
        assert gc.collect() == 0
    finally:
        gc.enable()


def build_tree(outside: dict[str, Any]) -> dict[str, Any]:
    owned_inner = {"a": [1, 2], "b": {"c": [3]}}
    outside["kept"] = owned_inner["b"]  # also referenced from outside the tree
    return {
        "x": [{"y": 1}, [1, 2, 3]],
        "shared": outside["module_constant"],
        "t": (outside["shared_list"], {"z": [1]}),
        "o": owned_inner,
    }


def test_dismantle_empties_only_what_the_tree_owns_alone() -> None:
    outside: dict[str, Any] = {"module_constant": {"keep": [1, 2, 3]}, "shared_list": [9, 9]}
    holder = [build_tree(outside)]
    # Owned alone: the root, x, {"y": 1}, [1, 2, 3], {"z": [1]}, [1], owned_inner, [1, 2].
    assert retire.dismantle(holder) == 8
    assert holder == []
    assert outside["module_constant"] == {"keep": [1, 2, 3]}
    assert outside["shared_list"] == [9, 9]
    assert outside["kept"] == {"c": [3]}


def test_dismantle_leaves_a_tree_someone_still_holds() -> None:
    tree = {"a": [1], "b": {"c": 2}}
    assert retire.dismantle([tree]) == 0
    assert tree == {"a": [1], "b": {"c": 2}}


async def test_reloader_frees_the_old_policy_only_after_its_last_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reload_module, "RETIRE_DELAY_SECONDS", 0.05)
    attempts = 0
    real_release = reload_module._release

    def counted_release(holder: list[Any]) -> bool:
        nonlocal attempts
        attempts += 1
        return real_release(holder)

    monkeypatch.setattr(reload_module, "_release", counted_release)
    (tmp_path / "p.yaml").write_text(ROLE.format(name="v1"))
    store = PolicyStore([tmp_path])
    reloader = Reloader(store, Metrics(), ReloadConfig(enabled=False))
    await reloader.start()
    try:
        in_flight = store.current  # a request that started with the old policy
        freed = asyncio.Event()
        loop = asyncio.get_running_loop()
        # The engine is freed in the reload thread: hand the news to the loop.
        weakref.finalize(in_flight.engine, loop.call_soon_threadsafe, freed.set)
        (tmp_path / "p.yaml").write_text(ROLE.format(name="v2"))
        assert await reloader.reload_now() is True
        await eventually(lambda: attempts >= 3, what="several release attempts meanwhile")
        assert not freed.is_set()
        assert decide(in_flight, ALICE, PODS).outcome == "allow"  # intact
        assert [d.name for d in in_flight.documents if d.kind == "ClusterRole"] == ["v1"]
        del in_flight
        await asyncio.wait_for(freed.wait(), 5)
        assert decide(store.current, ALICE, PODS).outcome == "allow"
    finally:
        await reloader.stop()

"""Owner rules end to end: the sidecar and the reference backing store as real
processes on loopback (Ironic node owners, restricted allocations)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.core.target import RequestTarget, Scope
from sidecar.policy.owner import JSON_PATCH, MERGE_PATCH, OwnerLookup, enforce_owner, patch_kind
from sidecar.policy.tools.explain import case_patch_kind
from tests.rigs import processes
from tests.rigs.client import BearerClient
from tests.rigs.paths import POLICY_CASES as CASES_DIR
from tests.rigs.policies import EVERYTHING
from tests.rigs.tokens import CASE_TOKENS as TOKENS


@pytest.fixture
def stack(tmp_path: Path, procs: processes.Processes) -> str:
    store = procs.store()
    tokens = processes.write_tokens(tmp_path, TOKENS)
    sidecar = procs.sidecar(
        {
            "upstream": store.url,
            "policies": str(CASES_DIR),
            "identity": {"tokenFile": str(tokens)},
            "reload": {"enabled": False},
        },
    )
    return sidecar.url


@pytest.fixture
async def client(stack: str) -> AsyncIterator[BearerClient]:
    async with aiohttp.ClientSession() as http:
        c = BearerClient(http, stack)
        for tenant in ("acme", "beta"):
            status, body = await c(
                "root", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
            )
            assert status == 201, body
        for name, owner, rclass in (
            ("n1", "acme", "gpu"),
            ("n2", "beta", "gpu"),
            ("n3", None, "gpu"),
            ("n4", "acme", "cpu"),
        ):
            spec: dict[str, Any] = {"resource_class": rclass}
            if owner:
                spec["owner"] = owner
            status, body = await c(
                "root", "POST", "/api/v1/nodes", {"metadata": {"name": name}, "spec": spec}
            )
            assert status == 201, body
        yield c


def names(body: Any) -> list[str]:
    return sorted(i["metadata"]["name"] for i in body["items"])


async def test_node_owners_get_patch_power_and_404_on_others(client: BearerClient) -> None:
    status, body = await client("oscar", "GET", "/api/v1/nodes/n1")
    assert status == 200
    assert body["spec"]["owner"] == "acme"
    for other in ("n2", "n3", "nosuch"):
        status, body = await client("oscar", "GET", f"/api/v1/nodes/{other}")
        assert status == 404
        assert body == {**body, "kind": "Status", "reason": "NotFound"}
    status, body = await client(
        "oscar",
        "PATCH",
        "/api/v1/nodes/n1",
        {"spec": {"resource_class": "big-gpu"}},
        "application/merge-patch+json",
    )
    assert status == 200, body
    status, body = await client("root", "GET", "/api/v1/nodes/n1")
    assert body["spec"] == {"owner": "acme", "resource_class": "big-gpu"}
    status, body = await client(
        "oscar",
        "PATCH",
        "/api/v1/nodes/n1",
        {"spec": {"owner": "beta"}},
        "application/merge-patch+json",
    )
    assert status == 403
    status, body = await client(
        "oscar",
        "PATCH",
        "/api/v1/nodes/n2",
        {"spec": {"resource_class": "x"}},
        "application/merge-patch+json",
    )
    assert status == 404
    status, body = await client("oscar", "PUT", "/api/v1/nodes/n1/power", {"target": "power on"})
    assert status == 202
    assert body["power_state"] == "power on"
    status, _ = await client("oscar", "PUT", "/api/v1/nodes/n2/power", {"target": "power on"})
    assert status == 404
    status, body = await client("root", "GET", "/api/v1/nodes/n2/power")
    assert body["power_state"] == "power off"
    # The owner of n2 may power it.
    assert (await client("bea", "PUT", "/api/v1/nodes/n2/power", {"target": "reboot"}))[0] == 202
    assert (await client("oscar", "DELETE", "/api/v1/nodes/n1"))[0] == 404


async def test_filtered_versus_full_node_lists(client: BearerClient) -> None:
    status, body = await client("oscar", "GET", "/api/v1/nodes")
    assert status == 200
    assert names(body) == ["n1", "n4"]
    status, body = await client("bea", "GET", "/api/v1/nodes")
    assert status == 200
    assert names(body) == ["n2"]
    status, body = await client("carol", "GET", "/api/v1/nodes")
    assert status == 200
    assert names(body) == ["n1", "n2", "n3", "n4"]
    status, body = await client("alice", "GET", "/api/v1/nodes")
    assert status == 404


async def test_restricted_and_unrestricted_allocations(client: BearerClient) -> None:
    acme = "/apis/baremetal/v1/tenants/acme/allocations"
    status, body = await client(
        "oscar", "POST", acme, {"metadata": {"name": "a1"}, "spec": {"resource_class": "gpu"}}
    )
    assert status == 201, body
    assert body["spec"]["owner"] == "acme"  # defaulted by the sidecar
    assert body["status"] == {"state": "active", "node": "n1"}
    status, body = await client(
        "oscar",
        "POST",
        acme,
        {"metadata": {"name": "a2"}, "spec": {"resource_class": "gpu", "owner": "beta"}},
    )
    assert status == 403
    assert "owner" in body["message"]
    # An admin (unconditional create) may allocate from any owner's nodes.
    status, body = await client(
        "root",
        "POST",
        acme,
        {"metadata": {"name": "a3"}, "spec": {"resource_class": "gpu", "owner": "beta"}},
    )
    assert status == 201
    assert body["status"]["node"] == "n2"
    # beta's unrestricted allocator (a TenantRoleBinding) may not take acme's nodes.
    status, body = await client(
        "bob",
        "POST",
        "/apis/baremetal/v1/tenants/beta/allocations",
        {"metadata": {"name": "b1"}, "spec": {"resource_class": "cpu", "owner": "acme"}},
    )
    assert status == 403
    assert "owner" in body["message"]
    status, body = await client("root", "GET", "/apis/baremetal/v1/tenants/beta/allocations/b1")
    assert status == 404
    # Restricted list: only acme-owned allocations; a3 (owner beta) is hidden.
    status, body = await client("oscar", "GET", acme)
    assert status == 200
    assert names(body) == ["a1"]
    status, body = await client("root", "GET", acme)
    assert names(body) == ["a1", "a3"]
    assert (await client("oscar", "GET", f"{acme}/a3"))[0] == 404
    assert (await client("oscar", "DELETE", f"{acme}/a1"))[0] == 200


@pytest.mark.parametrize(
    ("op", "code"),
    [
        # Read as JSON pointers (RFC 6901, the `jsonpointer` library the store applies
        # patches with): only the owner itself, or an object above it, is the owner.
        ({"op": "add", "path": "/spec/", "value": "beta"}, 0),  # the key "" of spec
        ({"op": "replace", "path": "/spec~1owner", "value": "beta"}, 0),  # key "spec/owner"
        ({"op": "replace", "path": "/spec/owner", "value": "beta"}, 403),
        ({"op": "replace", "path": "/spec", "value": {}}, 403),
        ({"op": "move", "from": "/spec", "path": "/x"}, 403),
        # Not a JSON pointer: the store's 400, answered here.
        ({"op": "replace", "path": "spec/owner", "value": "beta"}, 400),
        ({"op": "replace", "path": "/spec/~2", "value": "beta"}, 400),
    ],
)
def test_json_patch_paths_are_json_pointers(op: dict[str, Any], code: int) -> None:
    patch = [op]
    if not code:
        assert enforce_owner(patch, "acme", ("spec.owner",), "patch", "json") == patch
        return
    with pytest.raises(StatusError) as info:
        enforce_owner(patch, "acme", ("spec.owner",), "patch", "json")
    assert info.value.code == code


def test_a_test_cases_body_is_read_as_a_request_with_its_content_type() -> None:
    """`policy test` cases have no Content-Type: one rule (`patch_kind`) reads both."""
    assert case_patch_kind("PATCH", [{"op": "test", "path": "/a", "value": 1}]) == patch_kind(
        "PATCH", JSON_PATCH
    )
    assert case_patch_kind("PATCH", {"a": 1}) == patch_kind("PATCH", MERGE_PATCH) == "merge"
    assert case_patch_kind("PUT", {"a": 1}) == patch_kind("PUT", JSON_PATCH) == ""


NODE = RequestTarget(
    path="/api/v1/nodes/n1",
    verb="get",
    resource_request=True,
    api_version="v1",
    scope=Scope.CLUSTER,
    resource="nodes",
    name="n1",
)


class CountingUpstream:
    """`get_json` answering from `objects` (path → object; absent: 404), counting calls."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls = 0

    async def __call__(
        self, path: str, identity: Identity, request_id: str = ""
    ) -> tuple[int, Any]:
        self.calls += 1
        if path in self.objects:
            return 200, self.objects[path]
        return 404, {"kind": "Status", "code": 404}


async def test_the_lookup_caches_a_miss_as_it_caches_a_find() -> None:
    """Issue 28, finding 5: a find was cached and a miss never was, so the 404 of an
    unowned object came faster than the 404 of a missing one. Both are cached now."""
    upstream, owners = CountingUpstream(), OwnerLookup(maxsize=100, ttl=60)
    acme, beta = Identity("oscar", "acme"), Identity("bea", "beta")
    assert await owners.fetch(upstream, acme, NODE) is None
    assert await owners.fetch(upstream, acme, NODE) is None
    assert upstream.calls == 1
    # Keyed by tenant: another tenant's read goes to the upstream.
    upstream.objects["/api/v1/nodes/n1"] = {"spec": {"owner": "beta"}}
    assert await owners.fetch(upstream, beta, NODE) == {"spec": {"owner": "beta"}}
    assert await owners.fetch(upstream, beta, NODE) == {"spec": {"owner": "beta"}}
    assert upstream.calls == 2
    # Forgetting a miss: the next read sees the object.
    owners.forget(acme, NODE)
    assert await owners.fetch(upstream, acme, NODE) == {"spec": {"owner": "beta"}}
    assert upstream.calls == 3


async def test_a_fresh_read_neither_uses_nor_fills_the_cache() -> None:
    """The owner behind a write is read anew, and what it finds (or not) leaves no
    trace for later reads: they would otherwise tell a find from a miss."""
    upstream, owners = CountingUpstream(), OwnerLookup(maxsize=100, ttl=60)
    acme = Identity("oscar", "acme")
    upstream.objects["/api/v1/nodes/n1"] = {"spec": {"owner": "beta"}}
    assert await owners.fetch(upstream, acme, NODE, fresh=True) == {"spec": {"owner": "beta"}}
    del upstream.objects["/api/v1/nodes/n1"]
    assert await owners.fetch(upstream, acme, NODE) is None  # not from the cache
    assert await owners.fetch(upstream, acme, NODE) is None  # cached now
    upstream.objects["/api/v1/nodes/n1"] = {"spec": {"owner": "acme"}}
    assert await owners.fetch(upstream, acme, NODE, fresh=True) == {"spec": {"owner": "acme"}}
    assert upstream.calls == 3
    assert await owners.fetch(upstream, acme, NODE) is None  # the cached miss, unchanged


MAKER_POLICY = (
    EVERYTHING
    + """\
---
kind: ClusterRole
metadata: {name: node-maker}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [create, get, patch], when: owner}
---
kind: TenantRoleBinding
metadata: {name: node-makers, tenant: acme}
roleRef: {kind: ClusterRole, name: node-maker}
subjects: [{kind: User, name: nora}]
"""
)


async def test_a_tenant_reads_the_node_it_just_created(
    tmp_path: Path, procs: processes.Processes
) -> None:
    """Misses are cached (for `cache.ownerTtlSeconds`, long here), so a create forgets
    the caller's cached miss of the object it makes: `kubectl apply` (GET, then
    create) and a `get` right after it see the new object."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(MAKER_POLICY)
    tokens = [
        {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
        {"token": "nora", "user": "nora", "tenant": "acme", "groups": []},
    ]
    store = procs.store()
    sidecar = procs.sidecar(
        {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(processes.write_tokens(tmp_path, tokens))},
            "reload": {"enabled": False},
            "cache": {"ownerTtlSeconds": 600},
        }
    )
    async with aiohttp.ClientSession() as http:
        c = BearerClient(http, sidecar.url)
        status, body = await c("admin", "POST", "/api/v1/tenants", {"metadata": {"name": "acme"}})
        assert status == 201, body
        status, body = await c("nora", "GET", "/api/v1/nodes/made")
        assert status == 404, body  # the miss is cached now
        node = {"metadata": {"name": "made"}, "spec": {"resource_class": "gpu"}}
        status, body = await c("nora", "POST", "/api/v1/nodes", node)
        assert status == 201, body
        assert body["spec"]["owner"] == "acme"
        status, body = await c("nora", "GET", "/api/v1/nodes/made")
        assert status == 200, body

"""Backing store over HTTP: Ironic-style nodes (owner, resource class, power
subresource, ?owner= filter) and allocations with and without an owner."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from backing_store.app import make_app

Client = TestClient[web.Request, web.Application]

NODES = "/api/v1/nodes"
ALLOC = "/apis/baremetal/v1/tenants/acme/allocations"


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Any) -> Client:
    c: Client = await aiohttp_client(make_app(str(tmp_path / "store.db")))
    for tenant in ("acme", "beta"):
        resp = await c.post("/api/v1/tenants", json={"metadata": {"name": tenant}})
        assert resp.status == 201
    for name, owner, rclass in (
        ("n1", "beta", "gpu"),
        ("n2", "acme", "gpu"),
        ("n3", None, "gpu"),
        ("n4", "acme", "cpu"),
    ):
        spec: dict[str, Any] = {"resource_class": rclass}
        if owner:
            spec["owner"] = owner
        resp = await c.post(NODES, json={"metadata": {"name": name}, "spec": spec})
        assert resp.status == 201
    return c


async def node(client: Client, name: str) -> dict[str, Any]:
    resp = await client.get(f"{NODES}/{name}")
    assert resp.status == 200
    body: dict[str, Any] = await resp.json()
    return body


async def allocate(client: Client, name: str, spec: dict[str, Any], path: str = ALLOC) -> Any:
    resp = await client.post(path, json={"metadata": {"name": name}, "spec": spec})
    assert resp.status == 201, await resp.text()
    return await resp.json()


async def test_nodes_are_cluster_scoped_with_owner_filter(client: Client) -> None:
    body = await node(client, "n2")
    assert body["spec"] == {"resource_class": "gpu", "owner": "acme"}
    assert "tenant" not in body["metadata"]
    resp = await client.get(NODES, params={"owner": "acme"})
    assert [n["metadata"]["name"] for n in (await resp.json())["items"]] == ["n2", "n4"]
    resp = await client.get(NODES, params={"owner": "nobody"})
    assert (await resp.json())["items"] == []
    # changing the owner moves the node between filtered lists
    await client.patch(f"{NODES}/n3", json={"spec": {"owner": "beta"}})
    resp = await client.get(NODES, params={"owner": "beta"})
    assert [n["metadata"]["name"] for n in (await resp.json())["items"]] == ["n1", "n3"]


async def test_power_subresource(client: Client) -> None:
    resp = await client.get(f"{NODES}/n1/power")
    assert resp.status == 200
    assert (await resp.json())["power_state"] == "power off"
    resp = await client.put(f"{NODES}/n1/power", json={"target": "power on"})
    assert resp.status == 202
    assert (await resp.json())["power_state"] == "power on"
    assert (await node(client, "n1"))["status"]["power_state"] == "power on"
    assert (await (await client.get(f"{NODES}/n1/power")).json())["power_state"] == "power on"
    for bad in ({"target": "explode"}, {"target": 1}, {}):
        resp = await client.put(f"{NODES}/n1/power", json=bad)
        assert resp.status == 400
    resp = await client.put(
        f"{NODES}/n1/power", data="{", headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert (await client.get(f"{NODES}/ghost/power")).status == 404
    assert (await client.post(f"{NODES}/n1/power", json={})).status == 405
    assert (await client.get(f"{NODES}/n1/fan")).status == 404
    assert (await node(client, "n1"))["status"]["power_state"] == "power on"


async def test_allocation_with_owner_picks_a_node_of_that_owner(client: Client) -> None:
    alloc = await allocate(client, "a1", {"resource_class": "gpu", "owner": "acme"})
    assert alloc["status"] == {"state": "active", "node": "n2"}
    assert alloc["metadata"]["tenant"] == "acme"
    assert (await node(client, "n2"))["status"]["allocation"] == "acme/a1"
    # the only acme gpu node is taken now
    alloc = await allocate(client, "a2", {"resource_class": "gpu", "owner": "acme"})
    assert alloc["status"]["state"] == "error"
    assert "gpu" in alloc["status"]["last_error"]
    assert "acme" in alloc["status"]["last_error"]
    assert (await client.get(f"{ALLOC}/a2")).status == 200  # stored in state error
    # deleting the allocation frees its node, and a new one can take it
    assert (await client.delete(f"{ALLOC}/a1")).status == 200
    assert "allocation" not in (await node(client, "n2")).get("status", {})
    alloc = await allocate(client, "a3", {"resource_class": "gpu", "owner": "acme"})
    assert alloc["status"] == {"state": "active", "node": "n2"}


async def test_allocation_without_owner_takes_any_free_node_of_the_class(
    client: Client,
) -> None:
    picked = []
    for i in range(3):
        alloc = await allocate(client, f"x{i}", {"resource_class": "gpu"})
        assert alloc["status"]["state"] == "active"
        picked.append(alloc["status"]["node"])
    assert sorted(picked) == ["n1", "n2", "n3"]
    alloc = await allocate(client, "x3", {"resource_class": "gpu"})
    assert alloc["status"]["state"] == "error"
    alloc = await allocate(client, "c1", {"resource_class": "cpu"})
    assert alloc["status"] == {"state": "active", "node": "n4"}
    alloc = await allocate(client, "none", {"resource_class": "fpga"})
    assert alloc["status"]["state"] == "error"
    assert "fpga" in alloc["status"]["last_error"]


async def test_deleting_a_tenant_frees_its_allocated_nodes(client: Client) -> None:
    beta = "/apis/baremetal/v1/tenants/beta/allocations"
    await allocate(client, "b1", {"resource_class": "gpu", "owner": "beta"}, beta)
    assert (await node(client, "n1"))["status"]["allocation"] == "beta/b1"
    assert (await client.delete("/api/v1/tenants/beta")).status == 200
    assert "allocation" not in (await node(client, "n1"))["status"]
    resp = await client.get("/apis/baremetal/v1/allocations")
    assert (await resp.json())["items"] == []


@pytest.mark.parametrize(
    "spec",
    [
        None,
        {},
        {"resource_class": ""},
        {"resource_class": 3},
        {"resource_class": "gpu", "owner": 1},
    ],
)
async def test_bad_allocations_are_400(client: Client, spec: Any) -> None:
    body: dict[str, Any] = {"metadata": {"name": "bad"}}
    if spec is not None:
        body["spec"] = spec
    resp = await client.post(ALLOC, json=body)
    assert resp.status == 400
    assert (await resp.json())["kind"] == "Status"
    assert (await client.get(f"{ALLOC}/bad")).status == 404
    for name in ("n1", "n2", "n3"):
        assert "status" not in await node(client, name)

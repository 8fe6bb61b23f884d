"""Backing store over HTTP: reserved tenants, a new tenant's namespaces, and cascade
deletes of namespaces and tenants (counts before and after)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from backing_store.app import make_app
from sidecar.core.status import tenant_not_found

Client = TestClient[web.Request, web.Application]

SYSTEM = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Any) -> Client:
    c: Client = await aiohttp_client(make_app(str(tmp_path / "store.db")))
    return c


async def count(client: Client, path: str, **params: str) -> int:
    resp = await client.get(path, params=params, headers=SYSTEM)
    assert resp.status == 200, await resp.text()
    return len((await resp.json())["items"])


async def names(client: Client, path: str) -> list[str]:
    resp = await client.get(path, headers=SYSTEM)
    assert resp.status == 200, await resp.text()
    return [i["metadata"]["name"] for i in (await resp.json())["items"]]


async def test_reserved_tenants_exist_and_cannot_be_created_or_deleted(client: Client) -> None:
    assert await names(client, "/api/v1/tenants") == ["default", "system"]
    for tenant in ("system", "default"):
        assert await names(client, f"/api/v1/tenants/{tenant}/namespaces") == ["default", "system"]
        resp = await client.post("/api/v1/tenants", json={"metadata": {"name": tenant}})
        assert resp.status == 403, await resp.text()
        assert "reserved" in (await resp.json())["message"]
        resp = await client.delete(f"/api/v1/tenants/{tenant}")
        assert resp.status == 403
        assert (await client.get(f"/api/v1/tenants/{tenant}")).status == 200
    assert await names(client, "/api/v1/tenants") == ["default", "system"]


async def test_new_tenant_gets_default_and_system_namespaces(client: Client) -> None:
    resp = await client.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})
    assert resp.status == 201
    assert (await resp.json())["kind"] == "Tenant"
    assert await names(client, "/api/v1/tenants/acme/namespaces") == ["default", "system"]
    resp = await client.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})
    assert resp.status == 409
    # tenant names are DNS-1123 labels
    for bad in ("Acme", "a.b", "x" * 64):
        resp = await client.post("/api/v1/tenants", json={"metadata": {"name": bad}})
        assert resp.status == 400, bad
    assert await names(client, "/api/v1/tenants") == ["acme", "default", "system"]


async def test_missing_tenant_answers_the_concealment_body(client: Client) -> None:
    want = tenant_not_found("ghost").body()
    for method, path in (
        ("GET", "/api/v1/tenants/ghost"),
        ("DELETE", "/api/v1/tenants/ghost"),
        ("GET", "/api/v1/tenants/ghost/namespaces"),
        ("GET", "/apis/compute/v1/tenants/ghost/namespaces/dev/servers/x"),
        ("GET", "/apis/compute/v1/tenants/ghost/servers"),
        ("POST", "/apis/baremetal/v1/tenants/ghost/allocations"),
    ):
        resp = await client.request(method, path, json={"metadata": {"name": "x"}})
        assert resp.status == 404, (method, path)
        assert await resp.json() == want, (method, path)


async def seed_tenant(client: Client, tenant: str) -> None:
    assert (await client.post("/api/v1/tenants", json={"metadata": {"name": tenant}})).status == 201
    ns_path = f"/api/v1/tenants/{tenant}/namespaces"
    for ns in ("dev", "prod"):
        assert (await client.post(ns_path, json={"metadata": {"name": ns}})).status == 201
        base = f"/apis/compute/v1/tenants/{tenant}/namespaces/{ns}/servers"
        for i in range(3):
            body = {"metadata": {"name": f"s{i}"}, "tags": ["t"]}
            assert (await client.post(base, json=body)).status == 201
        pods = f"/api/v1/tenants/{tenant}/namespaces/{ns}/pods"
        assert (await client.post(pods, json={"metadata": {"name": "p"}})).status == 201
    roles = f"/apis/rbac.authorization.k8s.io/v1/tenants/{tenant}/tenantroles"
    assert (await client.post(roles, json={"metadata": {"name": "r"}})).status == 201


async def test_deleting_a_namespace_deletes_everything_in_it(client: Client) -> None:
    await seed_tenant(client, "acme")
    await seed_tenant(client, "beta")
    assert await count(client, "/apis/compute/v1/tenants/acme/servers") == 6
    assert await count(client, "/api/v1/tenants/acme/pods") == 2
    assert await count(client, "/apis/compute/v1/servers", **{"tags": "t"}) == 12

    resp = await client.delete("/api/v1/tenants/acme/namespaces/dev")
    assert resp.status == 200

    assert await count(client, "/apis/compute/v1/tenants/acme/namespaces/dev/servers") == 0
    assert await count(client, "/apis/compute/v1/tenants/acme/servers") == 3
    assert await count(client, "/api/v1/tenants/acme/pods") == 1
    assert await count(client, "/apis/compute/v1/tenants/beta/servers") == 6
    assert await count(client, "/apis/compute/v1/servers", **{"tags": "t"}) == 9
    assert await names(client, "/api/v1/tenants/acme/namespaces") == ["default", "prod", "system"]
    # the namespace is gone: writes into it are 404, and re-creating it starts empty
    resp = await client.post(
        "/apis/compute/v1/tenants/acme/namespaces/dev/servers", json={"metadata": {"name": "z"}}
    )
    assert resp.status == 404
    ns_path = "/api/v1/tenants/acme/namespaces"
    assert (await client.post(ns_path, json={"metadata": {"name": "dev"}})).status == 201
    assert await count(client, "/apis/compute/v1/tenants/acme/namespaces/dev/servers") == 0


async def test_deleting_a_tenant_deletes_everything_under_it(client: Client) -> None:
    await seed_tenant(client, "acme")
    await seed_tenant(client, "beta")
    total_servers = await count(client, "/apis/compute/v1/servers")
    total_ns = await count(client, "/api/v1/namespaces")
    assert total_servers == 12
    all_ns_before = await count(client, "/api/v1/tenants/acme/namespaces")
    assert all_ns_before == 4

    resp = await client.delete("/api/v1/tenants/acme")
    assert resp.status == 200

    assert await count(client, "/apis/compute/v1/servers") == 6
    assert await count(client, "/api/v1/pods") == 2
    assert await count(client, "/apis/rbac.authorization.k8s.io/v1/tenantroles") == 1
    assert await names(client, "/api/v1/tenants") == ["beta", "default", "system"]
    assert (await client.get("/api/v1/tenants/acme/namespaces")).status == 404
    assert total_ns == 2  # the short path for a system caller: the default tenant's namespaces
    # re-creating the tenant starts from scratch
    assert (await client.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})).status == 201
    assert await count(client, "/apis/compute/v1/tenants/acme/servers") == 0
    assert await count(client, "/api/v1/tenants/acme/namespaces") == 2

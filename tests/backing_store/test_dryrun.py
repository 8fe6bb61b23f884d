"""`dryRun=All` (DESIGN §7, §10) over HTTP against the real store process: every write
validates fully and answers as if done, and nothing is stored, changed, counted
(resourceVersion) or announced (watch). An unknown value is 400."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.rigs import processes

HDRS = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}
NS = "/api/v1/tenants/acme/namespaces"
CMS = f"{NS}/dev/configmaps"
SERVERS = "/apis/compute/v1/tenants/acme/namespaces/dev/servers"
DRY = {"dryRun": "All"}


@pytest.fixture
async def api(store: processes.Proc) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(store.url, headers=HDRS) as session:
        assert (
            await session.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})
        ).status == 201
        assert (await session.post(NS, json={"metadata": {"name": "dev"}})).status == 201
        yield session


async def ok(resp: aiohttp.ClientResponse, code: int = 200) -> Any:
    assert resp.status == code, await resp.text()
    return await resp.json()


async def expect_status(resp: aiohttp.ClientResponse, code: int) -> dict[str, Any]:
    assert resp.status == code, await resp.text()
    body: dict[str, Any] = await resp.json()
    assert body["kind"] == "Status"
    assert body["status"] == "Failure"
    assert body["code"] == code
    return body


async def snapshot(api: aiohttp.ClientSession) -> tuple[str, list[Any]]:
    """The store's resourceVersion and every object under tenant acme and the nodes."""
    objects: list[Any] = []
    rv = ""
    for path in (
        "/api/v1/tenants",
        f"{NS}",
        "/api/v1/tenants/acme/configmaps",
        "/apis/compute/v1/tenants/acme/servers",
        "/api/v1/nodes",
        "/apis/baremetal/v1/tenants/acme/allocations",
    ):
        body = await ok(await api.get(path))
        rv = body["metadata"]["resourceVersion"]
        objects += body["items"]
    return rv, objects


async def test_dry_run_create_answers_201_and_stores_nothing(api: aiohttp.ClientSession) -> None:
    before = await snapshot(api)
    body = {"metadata": {"name": "c1", "labels": {"app": "web"}}, "data": {"a": "b"}}
    got = await ok(await api.post(CMS, json=body, params=DRY), 201)
    assert got["kind"] == "ConfigMap"
    assert got["data"] == {"a": "b"}
    meta = got["metadata"]
    assert (meta["name"], meta["tenant"], meta["namespace"]) == ("c1", "acme", "dev")
    assert meta["uid"]
    assert meta["creationTimestamp"]
    assert "resourceVersion" not in meta  # nothing was written, as in Kubernetes
    await expect_status(await api.get(f"{CMS}/c1"), 404)
    assert await snapshot(api) == before
    # the real create still works afterwards, and takes the next resourceVersion
    real = await ok(await api.post(CMS, json=body), 201)
    assert int(real["metadata"]["resourceVersion"]) == int(before[0]) + 1


async def test_dry_run_validates_fully(api: aiohttp.ClientSession) -> None:
    await ok(await api.post(CMS, json={"metadata": {"name": "taken"}}), 201)
    before = await snapshot(api)
    await expect_status(await api.post(CMS, json={"metadata": {"name": "taken"}}, params=DRY), 409)
    await expect_status(
        await api.post(CMS, json={"metadata": {"name": "Bad_Name"}}, params=DRY), 400
    )
    await expect_status(await api.post(CMS, json={"metadata": {}}, params=DRY), 400)
    missing_ns = f"{NS}/nope/configmaps"
    await expect_status(
        await api.post(missing_ns, json={"metadata": {"name": "x"}}, params=DRY), 404
    )
    await expect_status(
        await api.put(f"{CMS}/ghost", json={"metadata": {"name": "ghost"}}, params=DRY), 404
    )
    await expect_status(await api.delete(f"{CMS}/ghost", params=DRY), 404)
    await expect_status(
        await api.post("/api/v1/tenants", json={"metadata": {"name": "system"}}, params=DRY), 403
    )
    await expect_status(await api.delete("/api/v1/tenants/default", params=DRY), 403)
    server = {"metadata": {"name": "s"}, "tags": ["a/b"]}
    await expect_status(await api.post(SERVERS, json=server, params=DRY), 400)
    assert await snapshot(api) == before


async def test_dry_run_update_and_patches_change_nothing(api: aiohttp.ClientSession) -> None:
    created = await ok(
        await api.post(CMS, json={"metadata": {"name": "c"}, "data": {"a": "1"}}), 201
    )
    rv = created["metadata"]["resourceVersion"]
    before = await snapshot(api)

    put = {"metadata": {"name": "c", "resourceVersion": rv}, "data": {"a": "2"}}
    got = await ok(await api.put(f"{CMS}/c", json=put, params=DRY))
    assert got["data"] == {"a": "2"}
    assert got["metadata"]["resourceVersion"] == rv
    assert got["metadata"]["uid"] == created["metadata"]["uid"]

    merge = await api.patch(
        f"{CMS}/c",
        data=json.dumps({"data": {"b": "3"}}),
        params=DRY,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert (await ok(merge))["data"] == {"a": "1", "b": "3"}
    strategic = await api.patch(
        f"{CMS}/c",
        data=json.dumps({"metadata": {"labels": {"x": "y"}}}),
        params=DRY,
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert (await ok(strategic))["metadata"]["labels"] == {"x": "y"}
    ops = [{"op": "replace", "path": "/data/a", "value": "9"}]
    jp = await api.patch(
        f"{CMS}/c",
        data=json.dumps(ops),
        params=DRY,
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert (await ok(jp))["data"] == {"a": "9"}
    # a stale resourceVersion is still a conflict in a dry run
    stale = {"metadata": {"name": "c", "resourceVersion": "1"}, "data": {}}
    await expect_status(await api.put(f"{CMS}/c", json=stale, params=DRY), 409)

    assert await snapshot(api) == before
    assert (await ok(await api.get(f"{CMS}/c")))["data"] == {"a": "1"}


async def test_dry_run_deletes_keep_everything(api: aiohttp.ClientSession) -> None:
    for name in ("a", "b"):
        await ok(await api.post(CMS, json={"metadata": {"name": name}}), 201)
    await ok(await api.post(SERVERS, json={"metadata": {"name": "s"}, "tags": ["red"]}), 201)
    before = await snapshot(api)

    got = await ok(await api.delete(f"{CMS}/a", params=DRY))
    assert (got["status"], got["details"]["name"]) == ("Success", "a")
    # kubectl delete --dry-run=server sends dryRun in a DeleteOptions body
    options = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "dryRun": ["All"],
        "propagationPolicy": "Background",
    }
    await ok(await api.delete(f"{CMS}/b", json=options))
    status = await ok(await api.delete(CMS, params=DRY))
    assert status["details"]["deleted"] == 2
    # cascades: a namespace with everything in it, a whole tenant
    await ok(await api.delete(f"{NS}/dev", params=DRY))
    await ok(await api.delete("/api/v1/tenants/acme", json=options))

    assert await snapshot(api) == before
    assert (await ok(await api.get(f"{SERVERS}/s")))["tags"] == ["red"]


async def test_dry_run_tenant_create_and_subresource_writes(api: aiohttp.ClientSession) -> None:
    await ok(await api.post(SERVERS, json={"metadata": {"name": "s"}}), 201)
    node = {"metadata": {"name": "n1"}, "spec": {"resource_class": "gpu", "owner": "acme"}}
    await ok(await api.post("/api/v1/nodes", json=node), 201)
    before = await snapshot(api)

    tenant = await ok(
        await api.post("/api/v1/tenants", json={"metadata": {"name": "t2"}}, params=DRY), 201
    )
    assert tenant["metadata"]["name"] == "t2"
    await expect_status(await api.get("/api/v1/tenants/t2"), 404)
    await expect_status(await api.get("/api/v1/tenants/t2/namespaces/default"), 404)

    resp = await api.put(f"{SERVERS}/s/tags/red", params=DRY)
    assert resp.status == 201
    await ok(await api.put(f"{SERVERS}/s/tags", json={"tags": ["x"]}, params=DRY))
    await ok(await api.put("/api/v1/nodes/n1/power", json={"target": "power on"}, params=DRY), 202)
    await ok(await api.put(f"{SERVERS}/s/status", json={"status": {"phase": "up"}}, params=DRY))
    alloc = {"metadata": {"name": "al"}, "spec": {"resource_class": "gpu"}}
    got = await ok(
        await api.post("/apis/baremetal/v1/tenants/acme/allocations", json=alloc, params=DRY), 201
    )
    assert got["status"] == {"state": "active", "node": "n1"}  # what it would have done

    assert await snapshot(api) == before
    assert (await ok(await api.get("/api/v1/nodes/n1/power")))["power_state"] == "power off"


async def test_dry_runs_send_no_watch_event(api: aiohttp.ClientSession) -> None:
    await ok(await api.post(CMS, json={"metadata": {"name": "old"}}), 201)
    async with api.get("/api/v1/tenants/acme/configmaps", params={"watch": "true"}) as watch:
        assert watch.status == 200
        await ok(await api.post(CMS, json={"metadata": {"name": "new"}}, params=DRY), 201)
        await ok(
            await api.put(
                f"{CMS}/old", json={"metadata": {"name": "old"}, "data": {"x": "1"}}, params=DRY
            )
        )
        await ok(await api.delete(f"{CMS}/old", params=DRY))
        await ok(await api.delete(f"{NS}/dev", params=DRY))
        await ok(await api.post(CMS, json={"metadata": {"name": "fence"}}), 201)
        line = await asyncio.wait_for(watch.content.readline(), 10)
    event = json.loads(line)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "fence")


@pytest.mark.parametrize("value", ["all", "None", "", "true"])
async def test_unknown_dry_run_value_is_400(api: aiohttp.ClientSession, value: str) -> None:
    await ok(await api.post(CMS, json={"metadata": {"name": "keep"}}), 201)
    before = await snapshot(api)
    q = {"dryRun": value}
    await expect_status(await api.post(CMS, json={"metadata": {"name": "x"}}, params=q), 400)
    await expect_status(
        await api.put(f"{CMS}/keep", json={"metadata": {"name": "keep"}}, params=q), 400
    )
    await expect_status(await api.patch(f"{CMS}/keep", json={"data": {}}, params=q), 400)
    await expect_status(await api.delete(f"{CMS}/keep", params=q), 400)
    await expect_status(await api.delete(CMS, params=q), 400)
    await expect_status(await api.delete(f"{CMS}/keep", json={"dryRun": [value]}), 400)
    # dryRun=All together with another value is still an unknown value
    await expect_status(
        await api.post(f"{CMS}?dryRun=All&dryRun={value}", json={"metadata": {"name": "x"}}), 400
    )
    assert await snapshot(api) == before


async def test_bad_delete_options_are_400(api: aiohttp.ClientSession) -> None:
    await ok(await api.post(CMS, json={"metadata": {"name": "keep"}}), 201)
    await expect_status(await api.delete(f"{CMS}/keep", json={"dryRun": "All"}), 400)
    await expect_status(await api.delete(f"{CMS}/keep", json=["All"]), 400)
    resp = await api.delete(
        f"{CMS}/keep", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    await expect_status(resp, 400)
    await ok(await api.get(f"{CMS}/keep"))

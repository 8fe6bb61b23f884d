"""`as=Table` answers (backing_store/tables.py) through the store app in-process: the
columns of each resource, content negotiation as kubectl does it, `includeObject`,
single objects, watches, and ages worded as Kubernetes words them. `kubectl get`'s
headers against a store process are in test_kubectl.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from backing_store.app import make_app
from backing_store.tables import human_duration

Client = TestClient[web.Request, web.Application]

# What kubectl 1.32 `get` sends (k8s.io/kubectl pkg/cmd/get/get.go).
KUBECTL_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
TABLE = {"Accept": KUBECTL_ACCEPT}
NS = "/tenants/acme/namespaces/dev"


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Any) -> Client:
    c: Client = await aiohttp_client(make_app(str(tmp_path / "store.db")))
    assert (await c.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})).status == 201
    resp = await c.post("/api/v1/tenants/acme/namespaces", json={"metadata": {"name": "dev"}})
    assert resp.status == 201
    return c


async def create(client: Client, path: str, body: dict[str, Any]) -> None:
    resp = await client.post(path, json=body)
    assert resp.status == 201, await resp.text()


async def table_of(client: Client, path: str, **params: str) -> dict[str, Any]:
    resp = await client.get(path, headers=TABLE, params=params)
    assert resp.status == 200, await resp.text()
    doc: dict[str, Any] = await resp.json()
    assert (doc["kind"], doc["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    return doc


def columns(doc: dict[str, Any]) -> list[str]:
    return [c["name"] for c in doc["columnDefinitions"]]


def cells(doc: dict[str, Any]) -> list[list[Any]]:
    """The cells of each row, without the age (which depends on the clock)."""
    return [row["cells"][:-1] for row in doc["rows"]]


async def test_columns_per_resource(client: Client) -> None:
    servers = f"/apis/compute/v1{NS}/servers"
    await create(client, servers, {"metadata": {"name": "web"}, "tags": ["prod", "web"]})
    await create(client, servers, {"metadata": {"name": "db"}, "status": {"state": "ACTIVE"}})
    node = {"metadata": {"name": "n1"}, "spec": {"owner": "acme", "resource_class": "gpu"}}
    await create(client, "/api/v1/nodes", node)
    await create(client, "/api/v1/nodes", {"metadata": {"name": "n2"}, "spec": {"owner": None}})
    alloc = {"metadata": {"name": "a1"}, "spec": {"resource_class": "gpu"}}
    await create(client, "/apis/baremetal/v1/tenants/acme/allocations", alloc)
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "a", "ready": True}]},
    }
    await create(client, f"/api/v1{NS}/pods", pod)
    deploy = {
        "metadata": {"name": "d"},
        "spec": {"replicas": 3},
        "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
    }
    await create(client, f"/apis/apps/v1{NS}/deployments", deploy)
    cm = {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}
    await create(client, f"/api/v1{NS}/configmaps", cm)
    secret = {"metadata": {"name": "s"}, "type": "Opaque", "stringData": {"u": "x", "p": "y"}}
    await create(client, f"/api/v1{NS}/secrets", secret)
    await create(client, f"/api/v1{NS}/serviceaccounts", {"metadata": {"name": "sa"}})

    want = {
        servers: (
            ["Name", "Tags", "Status", "Age"],
            [["db", "<none>", "ACTIVE"], ["web", "prod,web", "<none>"]],
        ),
        "/api/v1/nodes": (
            ["Name", "Owner", "Resource Class", "Age"],
            [["n1", "acme", "gpu"], ["n2", "<none>", "<none>"]],
        ),
        "/apis/baremetal/v1/tenants/acme/allocations": (
            ["Name", "Node", "State", "Age"],
            [["a1", "n1", "active"]],
        ),
        f"/api/v1{NS}/pods": (["Name", "Ready", "Status", "Age"], [["p", "1/2", "Running"]]),
        f"/apis/apps/v1{NS}/deployments": (
            ["Name", "Ready", "Up-to-date", "Available", "Age"],
            [["d", "2/3", 3, 2]],
        ),
        f"/api/v1{NS}/configmaps": (["Name", "Data", "Age"], [["c", 3]]),
        f"/api/v1{NS}/secrets": (["Name", "Type", "Data", "Age"], [["s", "Opaque", 2]]),
        f"/api/v1{NS}/serviceaccounts": (["Name", "Age"], [["sa"]]),
        "/api/v1/tenants/acme/namespaces": (["Name", "Age"], [["default"], ["dev"], ["system"]]),
    }
    for path, (names, rows) in want.items():
        doc = await table_of(client, path)
        assert columns(doc) == names, path
        assert cells(doc) == rows, path
        assert all(row["cells"][-1].endswith("s") for row in doc["rows"])  # "0s": just made
        assert doc["metadata"]["resourceVersion"]
        definition = doc["columnDefinitions"][0]
        assert (definition["type"], definition["format"]) == ("string", "name")


async def test_rows_carry_metadata_objects_or_nothing(client: Client) -> None:
    cms = f"/api/v1{NS}/configmaps"
    await create(client, cms, {"metadata": {"name": "c", "labels": {"a": "b"}}, "data": {"k": "v"}})
    row = (await table_of(client, cms))["rows"][0]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["apiVersion"] == "meta.k8s.io/v1"
    assert row["object"]["metadata"]["labels"] == {"a": "b"}
    assert "data" not in row["object"]
    full = (await table_of(client, cms, includeObject="Object"))["rows"][0]["object"]
    assert (full["kind"], full["data"]) == ("ConfigMap", {"k": "v"})
    assert "object" not in (await table_of(client, cms, includeObject="None"))["rows"][0]
    resp = await client.get(cms, headers=TABLE, params={"includeObject": "Everything"})
    assert resp.status == 400
    assert (await resp.json())["kind"] == "Status"
    # one object: a Table of one row
    one = await table_of(client, f"{cms}/c")
    assert cells(one) == [["c", 1]]


@pytest.mark.parametrize(
    ("accept", "want"),
    [
        (KUBECTL_ACCEPT, "Table meta.k8s.io/v1"),
        (
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            "Table meta.k8s.io/v1beta1",
        ),
        ("application/json, application/json;as=Table;v=v1;g=meta.k8s.io", "ConfigMapList v1"),
        ("application/json;as=Table;v=v2;g=meta.k8s.io,application/json", "ConfigMapList v1"),
        (
            "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json",
            "ConfigMapList v1",
        ),
        ("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,*/*", "ConfigMapList v1"),
        ("*/*;as=Table;v=v1;g=meta.k8s.io", "Table meta.k8s.io/v1"),
        ("", "ConfigMapList v1"),
    ],
)
async def test_content_negotiation(client: Client, accept: str, want: str) -> None:
    resp = await client.get(f"/api/v1{NS}/configmaps", headers={"Accept": accept})
    assert resp.status == 200
    doc = await resp.json()
    assert f"{doc['kind']} {doc['apiVersion']}" == want


async def test_a_watch_answers_a_table_per_event(client: Client) -> None:
    cms = f"/api/v1{NS}/configmaps"
    await create(client, cms, {"metadata": {"name": "old"}, "data": {"a": "1"}})
    params = {"watch": "true", "resourceVersion": "0", "timeoutSeconds": "5"}
    async with client.get(cms, headers=TABLE, params=params) as watch:
        assert watch.status == 200
        await create(client, cms, {"metadata": {"name": "new"}, "data": {}})
        events = []
        for _ in range(2):
            line = await asyncio.wait_for(watch.content.readline(), 5)
            events.append(json.loads(line))
    assert [e["type"] for e in events] == ["ADDED", "ADDED"]
    for event, row in zip(events, [["old", 1], ["new", 0]], strict=True):
        assert event["object"]["kind"] == "Table"
        assert columns(event["object"]) == ["Name", "Data", "Age"]
        assert cells(event["object"]) == [row]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (50 * 3600, "2d2h"),
        (8 * 86400, "8d"),
        (800 * 86400, "2y70d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_ages_read_as_kubernetes_prints_them(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text

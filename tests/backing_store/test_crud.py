"""Backing store over HTTP (in-process aiohttp server): generic CRUD, scopes, lists,
paging, owner filter, short paths, watch, and the bad inputs of issue 3."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from backing_store.app import HUB_KEY, make_app
from sidecar.core.status import tenant_not_found
from tests.rigs.waiting import eventually

Client = TestClient[web.Request, web.Application]

NS = "/api/v1/tenants/acme/namespaces"
SERVERS = "/apis/compute/v1/tenants/acme/namespaces/dev/servers"
PODS = "/api/v1/tenants/acme/namespaces/dev/pods"
SYSTEM = {"X-Remote-User": "admin", "X-Remote-Tenant": "system", "X-Remote-Group": "admins"}


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Any) -> Client:
    c: Client = await aiohttp_client(make_app(str(tmp_path / "store.db")))
    assert (await c.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})).status == 201
    assert (await c.post(NS, json={"metadata": {"name": "dev"}})).status == 201
    return c


async def status_of(resp: Any, code: int) -> dict[str, Any]:
    """Assert a Kubernetes Status failure body with this code; return it."""
    assert resp.status == code, await resp.text()
    body: dict[str, Any] = await resp.json()
    assert body["kind"] == "Status"
    assert body["status"] == "Failure"
    assert body["code"] == code
    assert body["message"]
    return body


def server(name: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"flavor": "small"}, **extra}


async def names(client: Client, path: str, **params: str) -> list[str]:
    resp = await client.get(path, params=params)
    assert resp.status == 200, await resp.text()
    return [item["metadata"]["name"] for item in (await resp.json())["items"]]


async def test_create_get_and_metadata(client: Client) -> None:
    resp = await client.post(SERVERS, json=server("web1"))
    assert resp.status == 201
    created = await resp.json()
    meta = created["metadata"]
    assert (meta["name"], meta["tenant"], meta["namespace"]) == ("web1", "acme", "dev")
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert created["kind"] == "Server"
    assert created["apiVersion"] == "compute/v1"
    got = await (await client.get(f"{SERVERS}/web1")).json()
    assert got == created
    head = await client.head(f"{SERVERS}/web1")
    assert head.status == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/nodes", {"metadata": {"name": "n1"}}),
        ("/api/v1/persistentvolumes", {"metadata": {"name": "pv1"}}),
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", {"metadata": {"name": "r"}}),
        (
            "/apis/rbac.authorization.k8s.io/v1/tenants/acme/tenantroles",
            {"metadata": {"name": "r"}},
        ),
        ("/apis/apps/v1/tenants/acme/namespaces/dev/deployments", {"metadata": {"name": "d"}}),
        ("/apis/batch/v1/tenants/acme/namespaces/dev/jobs", {"metadata": {"name": "j"}}),
        ("/apis/container/v1/tenants/acme/namespaces/dev/bays", {"metadata": {"name": "b"}}),
        ("/api/v1/tenants/acme/namespaces/dev/configmaps", {"metadata": {"name": "c"}}),
    ],
)
async def test_each_scope_round_trips(client: Client, path: str, body: dict[str, Any]) -> None:
    assert (await client.post(path, json=body)).status == 201
    got = await client.get(f"{path}/{body['metadata']['name']}")
    assert got.status == 200
    meta = (await got.json())["metadata"]
    tenant_scoped = "/tenants/acme/" in path
    assert meta.get("tenant") == ("acme" if tenant_scoped else None)
    assert meta.get("namespace") == ("dev" if "/namespaces/dev/" in path else None)


async def test_update_patch_resource_version_and_conflicts(client: Client) -> None:
    created = await (await client.post(SERVERS, json=server("web1"))).json()
    rv0 = int(created["metadata"]["resourceVersion"])

    created["spec"]["flavor"] = "large"
    resp = await client.put(f"{SERVERS}/web1", json=created)
    assert resp.status == 200
    updated = await resp.json()
    rv1 = int(updated["metadata"]["resourceVersion"])
    assert rv1 > rv0
    assert updated["spec"]["flavor"] == "large"
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]

    # the stale resourceVersion from `created` is refused and nothing changes
    created["spec"]["flavor"] = "tiny"
    body = await status_of(await client.put(f"{SERVERS}/web1", json=created), 409)
    assert body["reason"] == "Conflict"
    assert (await (await client.get(f"{SERVERS}/web1")).json())["spec"]["flavor"] == "large"

    resp = await client.patch(
        f"{SERVERS}/web1",
        data=json.dumps({"spec": {"flavor": None, "disk": 20}, "status": {"phase": "up"}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status == 200
    patched = await resp.json()
    assert patched["spec"] == {"disk": 20}
    assert patched["status"] == {"phase": "up"}
    assert int(patched["metadata"]["resourceVersion"]) > rv1

    stale = {"metadata": {"resourceVersion": str(rv0)}, "spec": {"disk": 1}}
    await status_of(await client.patch(f"{SERVERS}/web1", json=stale), 409)
    # a JSON patch applies (RFC 6902); server-side apply needs its fieldManager (422)
    resp = await client.patch(
        f"{SERVERS}/web1",
        data='[{"op": "replace", "path": "/spec/disk", "value": 30}]',
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert resp.status == 200
    assert (await resp.json())["spec"] == {"disk": 30}
    await status_of(
        await client.patch(
            f"{SERVERS}/web1",
            data="spec: {}",
            headers={"Content-Type": "application/apply-patch+yaml"},
        ),
        422,
    )
    await status_of(await client.put(f"{SERVERS}/nope", json=server("nope")), 404)


async def test_create_existing_is_409_and_unknown_type_404(client: Client) -> None:
    assert (await client.post(SERVERS, json=server("web1"))).status == 201
    body = await status_of(await client.post(SERVERS, json=server("web1")), 409)
    assert body["reason"] == "AlreadyExists"
    await status_of(await client.get("/apis/compute/v1/tenants/acme/namespaces/dev/widgets"), 404)
    await status_of(await client.get("/apis/nosuchgroup/v1/servers"), 404)
    await status_of(await client.get("/apis/compute/v9/servers"), 404)
    await status_of(await client.get(f"{SERVERS}/missing"), 404)


async def test_delete_and_deletecollection(client: Client) -> None:
    for name in ("a", "b", "c"):
        assert (await client.post(SERVERS, json=server(name))).status == 201
    uid = (await (await client.get(f"{SERVERS}/a")).json())["metadata"]["uid"]
    resp = await client.delete(f"{SERVERS}/a")
    assert resp.status == 200
    # an immediate delete answers a success Status, as Kubernetes does
    assert await resp.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "a", "group": "compute", "kind": "servers", "uid": uid},
    }
    await status_of(await client.delete(f"{SERVERS}/a"), 404)
    assert await names(client, SERVERS) == ["b", "c"]
    resp = await client.delete(SERVERS)
    assert resp.status == 200
    assert (await resp.json())["details"]["deleted"] == 2
    assert await names(client, SERVERS) == []


async def test_lists_at_namespace_tenant_and_cluster_level(client: Client) -> None:
    assert (await client.post("/api/v1/tenants", json={"metadata": {"name": "beta"}})).status == 201
    assert (await client.post(NS, json={"metadata": {"name": "prod"}})).status == 201
    await client.post(SERVERS, json=server("s1"))
    await client.post(SERVERS.replace("/dev/", "/prod/"), json=server("s2"))
    await client.post("/apis/compute/v1/tenants/beta/namespaces/default/servers", json=server("s3"))
    assert await names(client, SERVERS) == ["s1"]
    assert await names(client, "/apis/compute/v1/tenants/acme/servers") == ["s1", "s2"]
    assert await names(client, "/apis/compute/v1/servers") == ["s1", "s2", "s3"]
    lst = await (await client.get("/apis/compute/v1/servers", headers=SYSTEM)).json()
    assert lst["kind"] == "ServerList"
    assert lst["apiVersion"] == "compute/v1"
    assert int(lst["metadata"]["resourceVersion"]) >= max(
        int(i["metadata"]["resourceVersion"]) for i in lst["items"]
    )
    assert "continue" not in lst["metadata"]
    # tenant-scoped type: per tenant and across tenants
    tenants_ns = await names(client, "/api/v1/tenants/beta/namespaces")
    assert tenants_ns == ["default", "system"]


async def test_paging_with_limit_and_continue_everywhere(client: Client) -> None:
    assert (await client.post("/api/v1/tenants", json={"metadata": {"name": "beta"}})).status == 201
    expected = []
    for tenant in ("acme", "beta"):
        for i in range(7):
            name = f"s{i:02d}"
            path = f"/apis/compute/v1/tenants/{tenant}/namespaces/default/servers"
            assert (await client.post(path, json=server(name))).status == 201
            expected.append((tenant, name))
    cases = {
        "/apis/compute/v1/servers": expected,
        "/apis/compute/v1/tenants/acme/servers": [e for e in expected if e[0] == "acme"],
    }
    for path, want in cases.items():
        seen: list[tuple[str, str]] = []
        token = None
        pages = 0
        while True:
            params = {"limit": "3", **({"continue": token} if token else {})}
            body = await (await client.get(path, params=params, headers=SYSTEM)).json()
            assert len(body["items"]) <= 3
            seen += [(i["metadata"]["tenant"], i["metadata"]["name"]) for i in body["items"]]
            pages += 1
            token = body["metadata"].get("continue")
            if not token:
                break
        assert seen == want
        assert pages == -(-len(want) // 3)


@pytest.mark.parametrize("limit", ["0", "-1", "abc", "1.5", ""])
async def test_bad_limit_is_400(client: Client, limit: str) -> None:
    await status_of(await client.get(SERVERS, params={"limit": limit}), 400)


async def test_bad_continue_token_is_400(client: Client) -> None:
    await status_of(await client.get(SERVERS, params={"continue": "%%%"}), 400)
    # a token from another list does not page this one
    for n in ("a", "b"):
        await client.post("/api/v1/nodes", json={"metadata": {"name": n}})
    token = (await (await client.get("/api/v1/nodes", params={"limit": "1"})).json())["metadata"][
        "continue"
    ]
    await status_of(await client.get(SERVERS, params={"continue": token}), 400)


async def test_owner_filter_on_every_list(client: Client) -> None:
    for name, owner in (("a", "acme"), ("b", "beta"), ("c", "acme"), ("d", None)):
        spec = {"owner": owner} if owner else {}
        await client.post(SERVERS, json={"metadata": {"name": name}, "spec": spec})
        await client.post("/api/v1/nodes", json={"metadata": {"name": name}, "spec": spec})
    assert await names(client, SERVERS, owner="acme") == ["a", "c"]
    assert await names(client, "/apis/compute/v1/servers", owner="beta") == ["b"]
    assert await names(client, "/api/v1/nodes", owner="acme") == ["a", "c"]
    assert await names(client, "/api/v1/nodes", owner="acme", limit="1") == ["a"]
    assert await names(client, "/api/v1/nodes") == ["a", "b", "c", "d"]


async def test_short_paths_use_x_remote_tenant(client: Client) -> None:
    await client.post(SERVERS, json=server("mine"))
    acme = {"X-Remote-User": "alice", "X-Remote-Tenant": "acme"}
    assert await names_h(client, "/apis/compute/v1/namespaces/dev/servers", acme) == ["mine"]
    resp = await client.post(
        "/apis/compute/v1/namespaces/default/servers", json=server("viashort"), headers=acme
    )
    assert resp.status == 201
    assert (await resp.json())["metadata"]["tenant"] == "acme"
    # a system caller's short path means the default tenant
    resp = await client.post(
        "/apis/compute/v1/namespaces/default/servers", json=server("sys"), headers=SYSTEM
    )
    assert (await resp.json())["metadata"]["tenant"] == "default"
    assert await names_h(client, "/api/v1/namespaces", SYSTEM) == ["default", "system"]
    await status_of(await client.get("/apis/compute/v1/namespaces/dev/servers"), 400)
    ghost = {"X-Remote-Tenant": "ghost"}
    body = await status_of(await client.get("/api/v1/namespaces", headers=ghost), 404)
    assert body == tenant_not_found("ghost").body()


async def names_h(client: Client, path: str, headers: dict[str, str]) -> list[str]:
    resp = await client.get(path, headers=headers)
    assert resp.status == 200, await resp.text()
    return [i["metadata"]["name"] for i in (await resp.json())["items"]]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "not an object"),
        ('"text"', "not an object"),
        ('{"spec": {}}', "name missing"),
        ('{"metadata": {"name": ""}}', "name empty"),
        ('{"metadata": {"name": "Web_1"}}', "not DNS-1123"),
        ('{"metadata": {"name": 7}}', "name not a string"),
        ('{"metadata": "x"}', "metadata not an object"),
        ('{"metadata": {"name": "w", "tenant": "beta"}}', "tenant disagrees"),
        ('{"metadata": {"name": "w", "namespace": "prod"}}', "namespace disagrees"),
        ("", "empty body"),
    ],
)
async def test_bad_create_bodies_are_400_and_store_nothing(
    client: Client, data: str, why: str
) -> None:
    before = await names(client, "/apis/compute/v1/servers")
    resp = await client.post(SERVERS, data=data, headers={"Content-Type": "application/json"})
    await status_of(resp, 400)
    assert await names(client, "/apis/compute/v1/servers") == before, why


async def test_update_body_disagreeing_with_url_is_400(client: Client) -> None:
    await client.post(SERVERS, json=server("web1"))
    for meta in (
        {"name": "other"},
        {"name": "web1", "tenant": "beta"},
        {"name": "web1", "namespace": "x"},
    ):
        await status_of(await client.put(f"{SERVERS}/web1", json={"metadata": meta}), 400)
        patch = {"metadata": meta}
        await status_of(await client.patch(f"{SERVERS}/web1", json=patch), 400)
    await status_of(
        await client.put(
            f"{SERVERS}/web1", data="nope", headers={"Content-Type": "application/json"}
        ),
        400,
    )
    got = await (await client.get(f"{SERVERS}/web1")).json()
    assert got["metadata"]["name"] == "web1"
    assert got["spec"] == {"flavor": "small"}


async def test_writes_into_missing_tenant_or_namespace_are_404(client: Client) -> None:
    body = await status_of(
        await client.post(
            "/apis/compute/v1/tenants/ghost/namespaces/dev/servers", json=server("x")
        ),
        404,
    )
    assert body == tenant_not_found("ghost").body()
    body = await status_of(
        await client.post(SERVERS.replace("/dev/", "/nope/"), json=server("x")), 404
    )
    assert "namespaces" in body["message"]
    assert "nope" in body["message"]
    await status_of(await client.post("/api/v1/tenants/ghost/namespaces", json=server("x")), 404)
    assert await names(client, "/apis/compute/v1/servers") == []


async def test_scope_mismatches_and_malformed_paths(client: Client) -> None:
    await status_of(await client.get("/api/v1/tenants/acme/nodes"), 404)
    await status_of(await client.get("/apis/compute/v1/tenants/acme/servers/web1"), 404)
    await status_of(await client.post("/apis/compute/v1/servers", json=server("x")), 405)
    await status_of(await client.get("/api/v1/tenants/acme/namespaces/dev/pods/a%2Fb/x/.."), 400)
    await status_of(await client.get("/api/v1/tenants/Bad_Tenant/pods"), 400)
    assert (await client.get("/healthz")).status == 200


async def test_watch_streams_changes_after_start(client: Client) -> None:
    resp = await client.get(SERVERS, params={"watch": "1", "timeoutSeconds": "5"})
    assert resp.status == 200

    async def writes() -> None:
        await client.post(SERVERS, json=server("w1"))
        await client.post(PODS, json={"metadata": {"name": "not-a-server"}})
        await client.patch(f"{SERVERS}/w1", json={"spec": {"flavor": "big"}})
        await client.delete(f"{SERVERS}/w1")

    task = asyncio.create_task(writes())
    events: list[dict[str, Any]] = []
    while len(events) < 3:
        line = await asyncio.wait_for(resp.content.readline(), 5)
        assert line, "the watch ended early"
        events.append(json.loads(line))
    await task
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert all(e["object"]["metadata"]["name"] == "w1" for e in events)
    assert events[1]["object"]["spec"]["flavor"] == "big"
    resp.close()


async def test_watch_path_form_ends_at_timeout(client: Client) -> None:
    resp = await client.get(
        "/apis/compute/v1/watch/tenants/acme/namespaces/dev/servers",
        params={"timeoutSeconds": "1"},
    )
    assert resp.status == 200
    await client.post(SERVERS, json=server("z"))
    body = await asyncio.wait_for(resp.read(), 5)
    lines = [json.loads(x) for x in body.splitlines()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "z")]


async def test_a_watch_with_no_events_ends_when_its_client_leaves(client: Client) -> None:
    """Found by a hostile review: a watch that never gets an event held its handler and
    its place in the hub forever after its client had gone."""
    app = client.app
    assert app is not None
    hub = app[HUB_KEY]
    resp = await client.get(SERVERS, params={"watch": "true", "labelSelector": "never=x"})
    assert resp.status == 200
    assert len(hub.watchers) == 1
    resp.close()  # the client hangs up; no event will ever match
    await eventually(lambda: len(hub.watchers) == 0, what="the abandoned watch ended")


async def test_oversized_and_non_finite_bodies_are_4xx(client: Client) -> None:
    big = json.dumps({"metadata": {"name": "big"}, "spec": {"blob": "x" * (4 * 1024 * 1024)}})
    resp = await client.post(SERVERS, data=big, headers={"Content-Type": "application/json"})
    assert (await status_of(resp, 413))["reason"] == "RequestEntityTooLarge"
    resp = await client.post(
        SERVERS,
        data='{"metadata": {"name": "nan"}, "spec": {"x": NaN}}',
        headers={"Content-Type": "application/json"},
    )
    await status_of(resp, 400)
    assert await names(client, SERVERS) == []


async def test_head_on_a_list_and_status_subresource(client: Client) -> None:
    await client.post(SERVERS, json=server("web1"))
    assert (await client.head(SERVERS)).status == 200
    resp = await client.put(f"{SERVERS}/web1/status", json={"status": {"phase": "running"}})
    assert resp.status == 200
    got = await (await client.get(f"{SERVERS}/web1")).json()
    assert got["status"] == {"phase": "running"}
    assert got["spec"] == {"flavor": "small"}
    assert (await (await client.get(f"{SERVERS}/web1/status")).json())["status"] == got["status"]
    await status_of(await client.get(f"{SERVERS}/web1/logs"), 404)


async def test_watch_on_an_item_with_owner_filter(client: Client) -> None:
    await client.post(SERVERS, json=server("a"))
    await client.post(SERVERS, json=server("b"))
    resp = await client.get(
        f"{SERVERS}/a", params={"watch": "true", "owner": "acme", "timeoutSeconds": "1"}
    )
    assert resp.status == 200
    await client.patch(f"{SERVERS}/b", json={"spec": {"owner": "acme"}})  # other item
    await client.patch(f"{SERVERS}/a", json={"spec": {"flavor": "x"}})  # no owner yet
    await client.patch(f"{SERVERS}/a", json={"spec": {"owner": "acme"}})
    body = await asyncio.wait_for(resp.read(), 5)
    events = [json.loads(x) for x in body.splitlines()]
    # the object starts to match the filter: ADDED, as a Kubernetes watch with a selector
    assert [(e["type"], e["object"]["spec"].get("owner")) for e in events] == [("ADDED", "acme")]
    assert events[0]["object"]["metadata"]["name"] == "a"


async def test_deletecollection_honours_owner_and_tag_filters(client: Client) -> None:
    for name, owner, tags in (("a", "acme", ["x"]), ("b", "beta", ["x"]), ("c", "acme", [])):
        body = {"metadata": {"name": name}, "spec": {"owner": owner}, "tags": tags}
        assert (await client.post(SERVERS, json=body)).status == 201
    resp = await client.delete(SERVERS, params={"owner": "acme", "tags": "x"})
    assert resp.status == 200
    assert (await resp.json())["details"]["deleted"] == 1
    assert await names(client, SERVERS) == ["b", "c"]
    # only at the type's own scope
    await status_of(await client.delete("/apis/compute/v1/tenants/acme/servers"), 405)
    await status_of(await client.delete("/api/v1/tenants/acme/namespaces"), 405)
    assert await names(client, SERVERS) == ["b", "c"]


async def test_uid_and_creation_timestamp_are_the_stores_own(client: Client) -> None:
    """Issue 23: a client-supplied uid (even another object's) and creationTimestamp
    were kept. The store sets them on create, whatever was sent, and keeps them."""
    first = await (await client.post(SERVERS, json=server("a"))).json()
    claimed = {
        "uid": first["metadata"]["uid"],
        "creationTimestamp": "2001-01-01T00:00:00Z",
        "resourceVersion": "1",
    }
    resp = await client.post(SERVERS, json={"metadata": {"name": "b", **claimed}})
    assert resp.status == 201
    second = (await resp.json())["metadata"]
    assert second["uid"] != first["metadata"]["uid"]
    assert second["creationTimestamp"] != "2001-01-01T00:00:00Z"
    assert second["resourceVersion"] != "1"
    stamps = {k: second[k] for k in ("uid", "creationTimestamp")}
    forged = {"uid": "forged", "creationTimestamp": "2001-01-01T00:00:00Z"}
    attempts = [
        ("PUT", {"metadata": {"name": "b", **forged}, "spec": {}}, "application/json"),
        ("PATCH", {"metadata": forged}, "application/merge-patch+json"),
        ("PATCH", {"metadata": forged}, "application/strategic-merge-patch+json"),
        (
            "PATCH",
            [{"op": "replace", "path": "/metadata/uid", "value": "forged"}],
            "application/json-patch+json",
        ),
    ]
    for method, body, ctype in attempts:
        resp = await client.request(
            method, f"{SERVERS}/b", data=json.dumps(body), headers={"Content-Type": ctype}
        )
        assert resp.status == 200, await resp.text()
        got = (await resp.json())["metadata"]
        assert {k: got[k] for k in stamps} == stamps, ctype
    got = (await (await client.get(f"{SERVERS}/b")).json())["metadata"]
    assert {k: got[k] for k in stamps} == stamps
    # a dry-run create answers a uid and a creationTimestamp too, and no resourceVersion
    resp = await client.post(SERVERS, json=server("c"), params={"dryRun": "All"})
    dry = (await resp.json())["metadata"]
    assert dry["uid"]
    assert dry["creationTimestamp"]
    assert "resourceVersion" not in dry


async def test_secret_string_data_becomes_data(client: Client) -> None:
    secrets = "/api/v1/tenants/acme/namespaces/dev/secrets"
    body = {
        "metadata": {"name": "s"},
        "data": {"keep": "a2VlcA==", "user": "b2xk"},
        "stringData": {"user": "admin", "pass": "p@ss wörd"},
    }
    resp = await client.post(secrets, json=body)
    assert resp.status == 201, await resp.text()
    created = await resp.json()
    want = {"keep": "a2VlcA==", "user": "YWRtaW4=", "pass": "cEBzcyB3w7ZyZA=="}
    assert created["data"] == want
    assert "stringData" not in created
    stored = await (await client.get(f"{secrets}/s")).json()
    assert stored["data"] == want
    assert "stringData" not in stored
    assert "admin" not in json.dumps(stored)
    # on updates and patches too
    resp = await client.patch(f"{secrets}/s", json={"stringData": {"keep": "new"}})
    assert (await resp.json())["data"]["keep"] == "bmV3"
    put = {"metadata": {"name": "s"}, "stringData": {"only": "x"}}
    resp = await client.put(f"{secrets}/s", json=put)
    assert (await resp.json())["data"] == {"only": "eA=="}
    # what Kubernetes cannot decode either is a 400, and nothing changes
    for bad in (
        {"stringData": {"a": 1}},
        {"stringData": ["a"]},
        {"data": {"a": "not base64!"}},
        {"data": {"a": 5}},
        {"data": "x"},
    ):
        resp = await client.post(secrets, json={"metadata": {"name": "bad"}, **bad})
        await status_of(resp, 400)
        await status_of(await client.patch(f"{secrets}/s", json=bad), 400)
    assert await names(client, secrets) == ["s"]
    assert (await (await client.get(f"{secrets}/s")).json())["data"] == {"only": "eA=="}

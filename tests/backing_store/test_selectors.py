"""`fieldSelector` and `labelSelector` on lists, watches and deletecollection (DESIGN §10),
over HTTP against the real store process. Every selector case runs through a list
(SQL) and a watch (Python) so the two implementations cannot drift apart."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.rigs import processes

TENANT = "/api/v1/tenants/acme"
HDRS = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}
# name -> labels of the objects every case runs against
OBJECTS: dict[str, dict[str, str]] = {
    "a": {"app": "web", "tier": "front"},
    "b": {"app": "web", "tier": "back"},
    "c": {"app": "db"},
    "d": {},
    "e": {"app": "", "env": "prod"},
    "f": {"app.kubernetes.io/name": "x"},
}
ALL = sorted(OBJECTS)
_seq = itertools.count()

# (labelSelector, fieldSelector, names expected); each case matches at least one object
CASES: list[tuple[str, str, list[str]]] = [
    ("app=web", "", ["a", "b"]),
    ("app==web", "", ["a", "b"]),
    ("app!=web", "", ["c", "d", "e", "f"]),  # no label at all matches != too
    ("app in (web,db)", "", ["a", "b", "c"]),
    ("app in ( web , db )", "", ["a", "b", "c"]),
    ("app notin (web)", "", ["c", "d", "e", "f"]),
    ("tier", "", ["a", "b"]),
    ("!tier", "", ["c", "d", "e", "f"]),
    ("app=web,tier!=back", "", ["a"]),
    ("app=", "", ["e"]),
    ("app,!env", "", ["a", "b", "c"]),
    ("app.kubernetes.io/name=x", "", ["f"]),
    ("", "metadata.name=a", ["a"]),
    ("", "metadata.name==b", ["b"]),
    ("", "metadata.name!=a", ["b", "c", "d", "e", "f"]),
    ("", "metadata.name!=a,metadata.name!=b", ["c", "d", "e", "f"]),
    ("", "metadata.namespace!=elsewhere", ALL),
    ("app=web", "metadata.name!=a", ["b"]),
    ("", "", ALL),
]

BAD_LABELS = [
    "a in (",
    "a in ()",
    "a in x",
    "a=b=c",
    "a b",
    "!",
    "a,",
    ",a",
    "a>1",
    "-a=b",
    "a=" + "v" * 64,
    "k" * 64,
    "a notin (x",
    "a==(b)",
]
BAD_FIELDS = [
    "metadata.name",
    "spec.x=1",
    "metadata.labels=x",
    "metadata.name=a\\q",
    "metadata.name=a=b",
]


@pytest.fixture(scope="module")
def store_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Proc]:
    """One store for the module: each test works in a namespace of its own."""
    proc = processes.start_store(tmp_path_factory.mktemp("selectors"))
    yield proc
    proc.stop()


@pytest.fixture
async def api(store_proc: processes.Proc) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(store_proc.url, headers=HDRS) as session:
        if (await session.get(f"{TENANT}")).status == 404:
            resp = await session.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})
            assert resp.status in (201, 409)
        yield session


async def new_namespace(api: aiohttp.ClientSession) -> str:
    ns = f"ns{next(_seq)}"
    resp = await api.post(f"{TENANT}/namespaces", json={"metadata": {"name": ns}})
    assert resp.status == 201, await resp.text()
    return ns


def cms(ns: str) -> str:
    return f"{TENANT}/namespaces/{ns}/configmaps"


async def create(api: aiohttp.ClientSession, ns: str, name: str, labels: dict[str, str]) -> None:
    body = {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}
    resp = await api.post(cms(ns), json=body)
    assert resp.status == 201, await resp.text()


async def names(api: aiohttp.ClientSession, path: str, **params: str) -> list[str]:
    resp = await api.get(path, params=params)
    assert resp.status == 200, await resp.text()
    return [i["metadata"]["name"] for i in (await resp.json())["items"]]


def params_of(labels: str, fields: str) -> dict[str, str]:
    out = {}
    if labels:
        out["labelSelector"] = labels
    if fields:
        out["fieldSelector"] = fields
    return out


async def expect_status(resp: aiohttp.ClientResponse, code: int) -> dict[str, Any]:
    assert resp.status == code, await resp.text()
    body: dict[str, Any] = await resp.json()
    assert body["kind"] == "Status"
    assert body["status"] == "Failure"
    assert body["code"] == code
    return body


async def read_events(
    resp: aiohttp.ClientResponse, until: str, seconds: float = 10
) -> list[tuple[str, str]]:
    """(type, name) events until (and including) the first event about `until`."""
    events: list[tuple[str, str]] = []

    async def run() -> None:
        while True:
            line = await resp.content.readline()
            assert line, f"the watch ended early after {events}"
            event = json.loads(line)
            events.append((event["type"], event["object"]["metadata"]["name"]))
            if events[-1][1] == until:
                return

    await asyncio.wait_for(run(), seconds)
    return events


@pytest.mark.parametrize(("labels", "fields", "want"), CASES)
async def test_list_selectors(
    api: aiohttp.ClientSession, labels: str, fields: str, want: list[str]
) -> None:
    ns = await new_namespace(api)
    for name, obj_labels in OBJECTS.items():
        await create(api, ns, name, obj_labels)
    assert await names(api, cms(ns), **params_of(labels, fields)) == want
    # across the tenant's namespaces the same selector holds
    got = await names(api, f"{TENANT}/configmaps", **params_of(labels, fields))
    assert set(want) <= set(got)


@pytest.mark.parametrize(("labels", "fields", "want"), CASES)
async def test_watch_selectors(
    api: aiohttp.ClientSession, labels: str, fields: str, want: list[str]
) -> None:
    ns = await new_namespace(api)
    async with api.get(cms(ns), params={"watch": "true", **params_of(labels, fields)}) as resp:
        assert resp.status == 200
        for name, obj_labels in OBJECTS.items():
            await create(api, ns, name, obj_labels)
        # a fence: touching a matching object; events keep their order, so every event
        # the creates caused has arrived before this one
        fence = want[0]
        patch = await api.patch(
            f"{cms(ns)}/{fence}", json={"metadata": {"annotations": {"f": "1"}}}
        )
        assert patch.status == 200
        events = await read_events(resp, fence)
        while events[-1] != ("MODIFIED", fence):
            events += await read_events(resp, fence)
    assert events[:-1] == [("ADDED", n) for n in want]


async def test_field_selector_on_namespace_and_cluster_objects(api: aiohttp.ClientSession) -> None:
    one, two = await new_namespace(api), await new_namespace(api)
    await create(api, one, "x", {})
    await create(api, two, "y", {})
    assert await names(api, f"{TENANT}/configmaps", fieldSelector=f"metadata.namespace={one}") == [
        "x"
    ]
    got = await names(api, f"{TENANT}/configmaps", fieldSelector=f"metadata.namespace!={one}")
    assert "y" in got
    assert "x" not in got
    # objects that are not namespace-scoped have the empty namespace, as in Kubernetes
    node = await api.post("/api/v1/nodes", json={"metadata": {"name": f"n{next(_seq)}"}})
    assert node.status == 201
    nodes = await names(api, "/api/v1/nodes")
    assert await names(api, "/api/v1/nodes", fieldSelector="metadata.namespace=") == nodes
    assert await names(api, "/api/v1/nodes", fieldSelector="metadata.namespace=x") == []


async def test_selector_paging_counts_matching_objects_only(api: aiohttp.ClientSession) -> None:
    ns = await new_namespace(api)
    for i in range(6):
        await create(api, ns, f"o{i}", {"even": "yes"} if i % 2 == 0 else {})
    seen: list[str] = []
    params = {"labelSelector": "even=yes", "limit": "1"}
    while True:
        resp = await api.get(cms(ns), params=params)
        body = await resp.json()
        assert len(body["items"]) == 1  # never an empty page before the end
        seen += [i["metadata"]["name"] for i in body["items"]]
        token = body["metadata"].get("continue")
        if not token:
            break
        params["continue"] = token
    assert seen == ["o0", "o2", "o4"]


async def test_watch_sees_objects_enter_and_leave_a_selector(api: aiohttp.ClientSession) -> None:
    """As a Kubernetes watch: ADDED when an update makes an object match, DELETED when
    one makes it stop matching, nothing while it does not match."""
    ns = await new_namespace(api)
    await create(api, ns, "x", {})
    item = f"{cms(ns)}/x"
    async with api.get(cms(ns), params={"watch": "1", "labelSelector": "app=web"}) as resp:
        assert resp.status == 200
        for labels in ({"app": "web"}, {"app": "web", "v": "2"}, {"app": "db"}, {"app": "other"}):
            r = await api.patch(
                item, json={"metadata": {"labels": {"app": None, "v": None, **labels}}}
            )
            assert r.status == 200, await r.text()
        assert (await api.delete(item)).status == 200
        await create(api, ns, "fence", {"app": "web"})
        events = await read_events(resp, "fence")
    assert events == [("ADDED", "x"), ("MODIFIED", "x"), ("DELETED", "x"), ("ADDED", "fence")]


async def test_watch_from_resource_version_0_starts_with_the_current_objects(
    api: aiohttp.ClientSession,
) -> None:
    """kubectl `get NAME --watch` watches from resourceVersion=0 and drops the first event."""
    ns = await new_namespace(api)
    for name, labels in OBJECTS.items():
        await create(api, ns, name, labels)
    params = {"watch": "true", "resourceVersion": "0", "fieldSelector": "metadata.name=c"}
    async with api.get(cms(ns), params=params) as resp:
        assert resp.status == 200
        assert await read_events(resp, "c") == [("ADDED", "c")]
        await api.patch(f"{cms(ns)}/c", json={"data": {"k": "w"}})
        assert await read_events(resp, "c") == [("MODIFIED", "c")]


async def test_deletecollection_with_a_selector(api: aiohttp.ClientSession) -> None:
    ns = await new_namespace(api)
    for name, labels in OBJECTS.items():
        await create(api, ns, name, labels)
    resp = await api.delete(cms(ns), params={"labelSelector": "app in (web,db)"})
    assert resp.status == 200
    assert (await resp.json())["details"]["deleted"] == 3
    resp = await api.delete(cms(ns), params={"fieldSelector": "metadata.name=d"})
    assert resp.status == 200
    assert await names(api, cms(ns)) == ["e", "f"]


@pytest.mark.parametrize("bad", BAD_LABELS)
async def test_malformed_label_selector_is_400(api: aiohttp.ClientSession, bad: str) -> None:
    ns = await new_namespace(api)
    await create(api, ns, "keep", {"a": "b"})
    for method, extra in (("GET", {}), ("GET", {"watch": "true"}), ("DELETE", {})):
        resp = await api.request(method, cms(ns), params={"labelSelector": bad, **extra})
        body = await expect_status(resp, 400)
        assert "label selector" in body["message"] or "label key" in body["message"]
    assert await names(api, cms(ns)) == ["keep"]


@pytest.mark.parametrize("bad", BAD_FIELDS)
async def test_malformed_or_unsupported_field_selector_is_400(
    api: aiohttp.ClientSession, bad: str
) -> None:
    ns = await new_namespace(api)
    await create(api, ns, "keep", {})
    for method, extra in (("GET", {}), ("GET", {"watch": "true"}), ("DELETE", {})):
        resp = await api.request(method, cms(ns), params={"fieldSelector": bad, **extra})
        await expect_status(resp, 400)
    assert await names(api, cms(ns)) == ["keep"]


@pytest.mark.parametrize(
    "labels",
    [{"a": 1}, {"-a": "b"}, {"a": "b c"}, {"a": "v" * 64}, ["a"], {"a/": "b"}, {"A_b.c/d": "e"}],
)
async def test_invalid_labels_are_refused_on_write(api: aiohttp.ClientSession, labels: Any) -> None:
    """Selectors compare strings: labels must be label-syntax strings (as in Kubernetes)."""
    ns = await new_namespace(api)
    resp = await api.post(cms(ns), json={"metadata": {"name": "x", "labels": labels}})
    await expect_status(resp, 400)
    await create(api, ns, "ok", {"app.kubernetes.io/name": "web", "a": ""})
    resp = await api.patch(f"{cms(ns)}/ok", json={"metadata": {"labels": labels}})
    await expect_status(resp, 400)
    assert await names(api, cms(ns)) == ["ok"]


async def test_selectors_with_other_filters(api: aiohttp.ClientSession, tmp_path: Path) -> None:
    """Selectors AND with the store's own filters (tags on servers)."""
    ns = await new_namespace(api)
    servers = f"/apis/compute/v1/tenants/acme/namespaces/{ns}/servers"
    for name, labels, tags in (
        ("s1", {"app": "web"}, ["red"]),
        ("s2", {"app": "web"}, []),
        ("s3", {}, ["red"]),
    ):
        body = {"metadata": {"name": name, "labels": labels}, "tags": tags}
        assert (await api.post(servers, json=body)).status == 201
    assert await names(api, servers, labelSelector="app=web", tags="red") == ["s1"]


# -- the fields each resource is selectable by (what `kubectl describe` sends) -----------

EVENTS: dict[str, dict[str, Any]] = {
    "cm-created": {
        "involvedObject": {"kind": "ConfigMap", "namespace": "dev", "name": "web", "uid": "u1"},
        "reason": "Created",
        "type": "Normal",
        "source": {"component": "kubelet"},
    },
    "cm-other-uid": {
        "involvedObject": {"kind": "ConfigMap", "namespace": "dev", "name": "web", "uid": "u2"},
        "reason": "Created",
        "type": "Normal",
        "reportingComponent": "controller",
    },
    "node-warn": {
        "involvedObject": {"kind": "Node", "name": "n1", "uid": "n1"},
        "reason": "Rebooted",
        "type": "Warning",
        "involvedObject.name": "decoy",  # a key with a dot is not a path
    },
}
PODS: dict[str, dict[str, Any]] = {
    "run": {"spec": {"nodeName": "n1", "hostNetwork": True}, "status": {"phase": "Running"}},
    "done": {"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}},
    "failed": {"spec": {"nodeName": "n1", "restartPolicy": "Never"}, "status": {"phase": "Failed"}},
    "elsewhere": {"spec": {"nodeName": "n2", "hostNetwork": False}, "status": {"phase": "Running"}},
    "odd": {"spec": {"nodeName": 5, "hostNetwork": "true"}, "status": {"phase": ["Running"]}},
}
SECRETS: dict[str, dict[str, Any]] = {
    "tls": {"type": "kubernetes.io/tls"},
    "opaque": {"type": "Opaque"},
    "untyped": {},
}
REPLICASETS: dict[str, dict[str, Any]] = {
    "zero": {},
    "three": {"status": {"replicas": 3}},
    "float": {"status": {"replicas": 3.0}},
    "bool": {"status": {"replicas": True}},
}
KINDS = {
    "events": ("/api/v1", EVENTS),
    "pods": ("/api/v1", PODS),
    "secrets": ("/api/v1", SECRETS),
    "replicasets": ("/apis/apps/v1", REPLICASETS),
}
# (resource, fieldSelector, names expected)
FIELD_CASES: list[tuple[str, str, list[str]]] = [
    # kubectl describe configmap web -n dev (the terms come in any order)
    (
        "events",
        "involvedObject.uid=u1,involvedObject.name=web,involvedObject.namespace=dev,involvedObject.kind=ConfigMap",
        ["cm-created"],
    ),
    # kubectl describe node n1: an empty namespace, then by uid and by name
    (
        "events",
        "involvedObject.kind=Node,involvedObject.name=n1,involvedObject.namespace=,involvedObject.uid=n1",
        ["node-warn"],
    ),
    ("events", "reason=Created,type!=Warning", ["cm-created", "cm-other-uid"]),
    ("events", "type==Warning", ["node-warn"]),
    ("events", "source=kubelet", ["cm-created"]),
    ("events", "source=controller", ["cm-other-uid"]),  # no source: the reporting controller
    ("events", "reportingComponent=controller", ["cm-other-uid"]),
    ("events", "involvedObject.fieldPath=,involvedObject.apiVersion=", sorted(EVENTS)),
    # kubectl describe node n1: its pods that have not finished
    ("pods", "spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed", ["run"]),
    ("pods", "spec.host=n1,status.phase=Running", ["run"]),
    ("pods", "spec.hostNetwork=true", ["run"]),
    ("pods", "spec.hostNetwork=false", ["done", "elsewhere", "failed", "odd"]),
    ("pods", "spec.restartPolicy=Never", ["failed"]),
    ("pods", "spec.nodeName=", ["odd"]),  # a number is no node name
    ("pods", "status.podIP=,status.nominatedNodeName=,spec.schedulerName=", sorted(PODS)),
    ("pods", "spec.serviceAccountName!=x,metadata.name=run", ["run"]),
    ("secrets", "type=kubernetes.io/tls", ["tls"]),
    ("secrets", "type!=Opaque", ["tls", "untyped"]),
    ("replicasets", "status.replicas=0", ["bool", "float", "zero"]),
    ("replicasets", "status.replicas=3", ["three"]),
]


async def create_kind(api: aiohttp.ClientSession, ns: str, resource: str, name: str) -> None:
    prefix, objects = KINDS[resource]
    path = f"{prefix}/tenants/acme/namespaces/{ns}/{resource}"
    resp = await api.post(path, json={"metadata": {"name": name}, **objects[name]})
    assert resp.status == 201, await resp.text()


@pytest.mark.parametrize(("resource", "fields", "want"), FIELD_CASES)
async def test_kind_field_selectors_list_and_watch(
    api: aiohttp.ClientSession, resource: str, fields: str, want: list[str]
) -> None:
    ns = await new_namespace(api)
    prefix, objects = KINDS[resource]
    path = f"{prefix}/tenants/acme/namespaces/{ns}/{resource}"
    params = {"fieldSelector": fields}
    async with api.get(path, params={"watch": "true", **params}) as watch:
        assert watch.status == 200
        for name in objects:
            await create_kind(api, ns, resource, name)
        # a fence: touching the last matching object; events keep their order
        fence = want[-1]
        resp = await api.patch(f"{path}/{fence}", json={"metadata": {"labels": {"f": "1"}}})
        assert resp.status == 200
        events = await read_events(watch, fence)
        while events[-1] != ("MODIFIED", fence):
            events += await read_events(watch, fence)
    assert sorted(n for t, n in events[:-1]) == want
    assert sorted(await names(api, path, **params)) == want
    # the same at the cluster level, where `kubectl describe node` lists pods
    got = await names(api, f"{prefix}/{resource}", **params)
    assert set(want) <= set(got)


@pytest.mark.parametrize(
    ("path", "fields", "message"),
    [
        ("/api/v1/pods", "spec.containers=x", "field label not supported: spec.containers"),
        ("/api/v1/events", "involvedObject.foo=x", "field label not supported: involvedObject.foo"),
        ("/api/v1/secrets", "data=x", "field label not supported: data"),
        ("/api/v1/nodes", "spec.owner=acme", "field label not supported: spec.owner"),
        (
            "/api/v1/configmaps",
            "spec.nodeName=n1",
            '"spec.nodeName" is not a known field selector: only "metadata.name", "metadata.namespace"',
        ),
        (
            "/apis/batch/v1/jobs",
            "status.phase=x",
            'field label "status.phase" not supported for batchv1.Job',
        ),
    ],
)
async def test_a_field_the_kind_cannot_be_selected_by_is_400(
    api: aiohttp.ClientSession, path: str, fields: str, message: str
) -> None:
    for extra in ({}, {"watch": "true"}):
        resp = await api.get(path, params={"fieldSelector": fields, **extra})
        body = await expect_status(resp, 400)
        assert body["message"] == message
    resp = await api.get("/apis/batch/v1/jobs", params={"fieldSelector": "status.successful=0"})
    assert resp.status == 200

"""What the store does to every object before storing it (backing_store/conversion.py),
over HTTP (in-process aiohttp server): empty metadata collections are not kept, as a
Kubernetes API server's typed round trip drops them (`omitempty` on ObjectMeta).

Why it matters: `kubectl diff` and client-side `kubectl apply` send a strategic merge
patch with `"metadata": {"annotations": {}}` for an object that has no
last-applied annotation; kept, that empty map made `kubectl diff` report a difference
(exit 1) where there is none (issue 23)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from backing_store.app import make_app

Client = TestClient[web.Request, web.Application]

CONFIGMAPS = "/api/v1/tenants/acme/namespaces/dev/configmaps"
SMP = "application/strategic-merge-patch+json"
EMPTY: dict[str, Any] = {"labels": {}, "annotations": {}, "finalizers": [], "ownerReferences": []}


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Any) -> Client:
    c: Client = await aiohttp_client(make_app(str(tmp_path / "store.db")))
    assert (await c.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})).status == 201
    ns = "/api/v1/tenants/acme/namespaces"
    assert (await c.post(ns, json={"metadata": {"name": "dev"}})).status == 201
    return c


def no_empty_metadata(obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    assert not set(EMPTY) & set(meta), meta
    for entry in meta.get("managedFields", []):
        assert "f:annotations" not in str(entry.get("fieldsV1")), entry


async def test_empty_metadata_collections_are_not_stored(client: Client) -> None:
    resp = await client.post(CONFIGMAPS, json={"metadata": {"name": "c", **EMPTY}})
    assert resp.status == 201, await resp.text()
    no_empty_metadata(await resp.json())
    no_empty_metadata(await (await client.get(f"{CONFIGMAPS}/c")).json())
    # kubectl diff's dry-run patch, and the same patch for real: nothing changes.
    before = await (await client.get(f"{CONFIGMAPS}/c")).json()
    patch = b'{"metadata":{"annotations":{}}}'
    for query in ("?dryRun=All", ""):
        resp = await client.patch(
            f"{CONFIGMAPS}/c{query}", data=patch, headers={"Content-Type": SMP}
        )
        assert resp.status == 200, await resp.text()
        no_empty_metadata(await resp.json())
    after = await (await client.get(f"{CONFIGMAPS}/c")).json()
    after["metadata"].pop("resourceVersion")
    before["metadata"].pop("resourceVersion")
    assert after == before
    # A replace with empty collections, and a patch that empties one.
    resp = await client.put(f"{CONFIGMAPS}/c", json={"metadata": {"name": "c", **EMPTY}})
    assert resp.status == 200, await resp.text()
    no_empty_metadata(await resp.json())
    labelled = {"metadata": {"labels": {"a": "b"}, "annotations": {"x": "y"}}}
    assert (await client.patch(f"{CONFIGMAPS}/c", json=labelled)).status == 200
    cleared = {"metadata": {"labels": {"a": None}, "annotations": {"x": None}}}
    resp = await client.patch(f"{CONFIGMAPS}/c", json=cleared)
    assert resp.status == 200, await resp.text()
    no_empty_metadata(await (await client.get(f"{CONFIGMAPS}/c")).json())


async def test_metadata_that_is_not_empty_is_kept(client: Client) -> None:
    meta = {"name": "k", "labels": {"a": "b"}, "annotations": {"x": ""}, "finalizers": ["f/x"]}
    resp = await client.post(CONFIGMAPS, json={"metadata": meta})
    assert resp.status == 201, await resp.text()
    got = (await resp.json())["metadata"]
    assert (got["labels"], got["annotations"], got["finalizers"]) == (
        {"a": "b"},
        {"x": ""},
        ["f/x"],
    )

"""Issue 28: the reference store honours a write's preconditions for every body type,
so the sidecar can hold a write to the state it was decided on: `metadata.resourceVersion`
in a PUT, merge, strategic merge and apply body, a JSON patch `test` on
`/metadata/resourceVersion` (or `/metadata/uid`), and an apply's `metadata.uid`. A
stale one is 409 Conflict and nothing is stored; a current one is applied."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.rigs import processes

HDRS = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}
CMS = "/api/v1/tenants/acme/namespaces/dev/configmaps"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


@pytest.fixture
async def api(store: processes.Proc) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(store.url, headers=HDRS) as session:
        for path, name in (("/api/v1/tenants", "acme"), ("/api/v1/tenants/acme/namespaces", "dev")):
            assert (await session.post(path, json={"metadata": {"name": name}})).status == 201
        yield session


def cm(name: str = "c", rv: str | None = None, uid: str | None = None, **data: str) -> Any:
    meta: dict[str, Any] = {"name": name}
    if rv is not None:
        meta["resourceVersion"] = rv
    if uid is not None:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


async def send(api: aiohttp.ClientSession, method: str, path: str, body: Any, ctype: str) -> Any:
    if ctype == APPLY and "fieldManager" not in path:
        path += "?fieldManager=test"
    async with api.request(
        method, path, data=json.dumps(body), headers={"Content-Type": ctype}
    ) as r:
        return r.status, await r.json()


async def made(api: aiohttp.ClientSession) -> dict[str, Any]:
    status, obj = await send(api, "POST", CMS, cm(v="1"), "application/json")
    assert status == 201, obj
    meta: dict[str, Any] = obj["metadata"]
    return meta


def bodies(rv: str, uid: str) -> list[tuple[str, Any, str]]:
    """One write of each body type holding `rv` (and for apply also `uid`)."""
    return [
        ("PUT", cm(rv=rv, v="2"), "application/json"),
        ("PATCH", {"metadata": {"resourceVersion": rv}, "data": {"v": "2"}}, MERGE),
        ("PATCH", {"metadata": {"resourceVersion": rv}, "data": {"v": "2"}}, STRATEGIC),
        (
            "PATCH",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "replace", "path": "/data/v", "value": "2"},
            ],
            JSON_PATCH,
        ),
        ("PATCH", cm(rv=rv, v="2"), APPLY),
        ("PATCH", cm(uid=uid, v="2"), APPLY),
        (
            "PATCH",
            [
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "replace", "path": "/data/v", "value": "2"},
            ],
            JSON_PATCH,
        ),
    ]


async def test_a_stale_precondition_is_409_for_every_body_type(
    api: aiohttp.ClientSession,
) -> None:
    meta = await made(api)
    for method, body, ctype in bodies("1", "not-its-uid"):
        status, answer = await send(api, method, f"{CMS}/c", body, ctype)
        assert status == 409, (ctype, body, answer)
        assert answer["reason"] == "Conflict", answer
    async with api.get(f"{CMS}/c") as r:
        stored = await r.json()
    assert stored["data"] == {"v": "1"}
    assert stored["metadata"]["resourceVersion"] == meta["resourceVersion"]


async def test_a_current_precondition_is_applied_for_every_body_type(
    api: aiohttp.ClientSession,
) -> None:
    for n, (method, body, ctype) in enumerate(bodies("{rv}", "{uid}")):
        name = f"c{n}"
        status, obj = await send(api, "POST", CMS, cm(name, v="1"), "application/json")
        assert status == 201, obj
        text = json.dumps(body).replace("{rv}", obj["metadata"]["resourceVersion"])
        text = text.replace("{uid}", obj["metadata"]["uid"]).replace('"c"', json.dumps(name))
        # (an apply takes data.v from its creator: forced)
        path = f"{CMS}/{name}" + ("?fieldManager=test&force=true" if ctype == APPLY else "")
        status, answer = await send(api, method, path, json.loads(text), ctype)
        assert status == 200, (ctype, answer)
        assert answer["data"] == {"v": "2"}


async def test_a_stale_apply_that_changes_nothing_is_still_refused(
    api: aiohttp.ClientSession,
) -> None:
    """The no-op shortcut of apply came before the version check: a stale apply of
    what is stored answered 200 with an object of another version than it named."""
    await made(api)
    status, _ = await send(api, "PATCH", f"{CMS}/c?fieldManager=m", cm(v="1"), APPLY)
    assert status == 200
    status, answer = await send(api, "PATCH", f"{CMS}/c?fieldManager=m", cm(rv="1", v="1"), APPLY)
    assert status == 409, answer


async def test_an_apply_naming_a_version_never_creates(api: aiohttp.ClientSession) -> None:
    status, answer = await send(api, "PATCH", f"{CMS}/new", cm("new", rv="5", v="1"), APPLY)
    assert status == 409, answer
    async with api.get(f"{CMS}/new") as r:
        assert r.status == 404
    # an apply with a uid creates (the store sets its own uid, as on every create)
    status, answer = await send(api, "PATCH", f"{CMS}/new", cm("new", uid="mine", v="1"), APPLY)
    assert status == 201, answer
    assert answer["metadata"]["uid"] != "mine"

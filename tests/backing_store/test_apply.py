"""Server-side apply and managedFields (backing_store/apply.py) over HTTP against the
real store process: create when missing, apply again, conflicts (409 as Kubernetes
words them) and `force`, fields an applier stops naming, Update managers, the options
Kubernetes requires (`fieldManager`) and malformed apply bodies (400, nothing stored).
The real `kubectl apply --server-side` is in test_kubectl.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backing_store import apply as managed
from backing_store.errors import StatusError
from tests.rigs import processes

HDRS = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}
CMS = "/api/v1/tenants/acme/namespaces/dev/configmaps"
DEPLOYS = "/apis/apps/v1/tenants/acme/namespaces/dev/deployments"
APPLY = {"Content-Type": "application/apply-patch+yaml"}


@pytest.fixture
async def api(store: processes.Proc) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(store.url, headers=HDRS) as session:
        for path, name in (("/api/v1/tenants", "acme"), ("/api/v1/tenants/acme/namespaces", "dev")):
            assert (await session.post(path, json={"metadata": {"name": name}})).status == 201
        yield session


def cm(name: str = "c", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


async def apply(
    api: aiohttp.ClientSession,
    body: Any,
    manager: str | None = "mgr",
    *,
    path: str = f"{CMS}/c",
    force: bool | None = None,
    code: int = 200,
) -> dict[str, Any]:
    params = {} if manager is None else {"fieldManager": manager}
    if force is not None:
        params["force"] = "true" if force else "false"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await api.patch(path, data=data, headers=APPLY, params=params)
    assert resp.status == code, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


def owners(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


async def stored(api: aiohttp.ClientSession, path: str = f"{CMS}/c") -> dict[str, Any]:
    resp = await api.get(path)
    assert resp.status == 200
    got: dict[str, Any] = await resp.json()
    return got


async def test_apply_creates_then_applies_again(api: aiohttp.ClientSession) -> None:
    created = await apply(api, cm(a="1", b="2"), code=201)
    assert created["data"] == {"a": "1", "b": "2"}
    assert created["metadata"]["uid"]
    entry = created["metadata"]["managedFields"][0]
    assert {k: v for k, v in entry.items() if k != "time"} == {
        "manager": "mgr",
        "operation": "Apply",
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:data": {"f:a": {}, "f:b": {}}},
    }
    assert entry["time"].endswith("Z")
    # the same apply again changes nothing and stores nothing
    again = await apply(api, cm(a="1", b="2"))
    assert again == created == await stored(api)
    # a field the applier stops naming goes; a new one comes
    changed = await apply(api, cm(a="1", c="3"))
    assert changed["data"] == {"a": "1", "c": "3"}
    assert owners(changed) == {("mgr", "Apply"): {"f:data": {"f:a": {}, "f:c": {}}}}
    assert int(changed["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    # YAML is the body's native form
    yaml_body = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: '1'\n"
    assert (await apply(api, yaml_body))["data"] == {"a": "1"}


async def test_a_conflict_is_409_unless_forced(api: aiohttp.ClientSession) -> None:
    await apply(api, cm(a="1", b="2"), "one", code=201)
    # the same value is no conflict: both own the field
    shared = await apply(api, cm(a="1"), "two")
    assert owners(shared)[("two", "Apply")] == {"f:data": {"f:a": {}}}
    status = await apply(api, cm(a="9", b="8"), "three", force=False, code=409)
    assert status["reason"] == "Conflict"
    assert status["message"] == (
        'Apply failed with 3 conflicts: conflicts with "one":\n- .data.a\n- .data.b\n'
        'conflicts with "two":\n- .data.a'
    )
    assert status["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "one"', "field": ".data.a"},
        {"reason": "FieldManagerConflict", "message": 'conflict with "one"', "field": ".data.b"},
        {"reason": "FieldManagerConflict", "message": 'conflict with "two"', "field": ".data.a"},
    ]
    assert (await stored(api))["data"] == {"a": "1", "b": "2"}
    one = await apply(api, cm(b="8"), "three", code=409)
    assert one["message"] == 'Apply failed with 1 conflict: conflict with "one": .data.b'
    forced = await apply(api, cm(a="9", b="8"), "three", force=True)
    assert forced["data"] == {"a": "9", "b": "8"}
    assert owners(forced) == {("three", "Apply"): {"f:data": {"f:a": {}, "f:b": {}}}}
    # the losers own nothing any more: a field they stop naming is not removed
    assert (await apply(api, cm(), "one"))["data"] == {"a": "9", "b": "8"}


async def test_update_managers_own_what_they_change(api: aiohttp.ClientSession) -> None:
    resp = await api.post(CMS, json=cm(a="1"), params={"fieldManager": "kubectl-create"})
    assert resp.status == 201
    created = await resp.json()
    assert owners(created) == {("kubectl-create", "Update"): {"f:data": {"f:a": {}}}}
    # without fieldManager: the User-Agent's product name
    resp = await api.patch(
        f"{CMS}/c", json={"data": {"b": "2"}}, headers={"User-Agent": "kubectl-edit/v1.32.4"}
    )
    patched = await resp.json()
    assert owners(patched) == {
        ("kubectl-create", "Update"): {"f:data": {"f:a": {}}},
        ("kubectl-edit", "Update"): {"f:data": {"f:b": {}}},
    }
    # an apply that changes an Update manager's field conflicts with it, naming its version
    status = await apply(api, cm(a="2"), "kubectl", code=409)
    time = patched["metadata"]["managedFields"][0]["time"]
    assert status["message"] == (
        f'Apply failed with 1 conflict: conflict with "kubectl-create" using v1 at {time}: .data.a'
    )
    # a client's managedFields are not taken
    bogus = {"metadata": {"managedFields": [{"manager": "x", "operation": "Apply"}]}}
    resp = await api.patch(f"{CMS}/c", json=bogus, params={"fieldManager": "m"})
    assert owners(await resp.json()) == owners(patched)


async def test_keyed_lists_merge_by_their_keys(api: aiohttp.ClientSession) -> None:
    def deploy(*containers: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": list(containers)}}},
        }

    path = f"{DEPLOYS}/d"
    await apply(api, deploy({"name": "a", "image": "a:1"}), "ci", path=path, code=201)
    both = await apply(api, deploy({"name": "b", "image": "b:1"}), "ops", path=path)
    containers = both["spec"]["template"]["spec"]["containers"]
    assert containers == [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]
    ci = owners(both)[("ci", "Apply")]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert ci == {'k:{"name":"a"}': {".": {}, "f:image": {}, "f:name": {}}}
    status = await apply(api, deploy({"name": "b", "image": "b:2"}), "ci", path=path, code=409)
    assert (
        status["details"]["causes"][0]["field"] == '.spec.template.spec.containers[name="b"].image'
    )
    # ci stops naming its container: it goes, ops's stays
    gone = await apply(api, deploy(), "ci", path=path)
    assert gone["spec"]["template"]["spec"]["containers"] == [{"name": "b", "image": "b:1"}]


async def test_stringdata_of_an_applied_secret(api: aiohttp.ClientSession) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"user": "admin"},
    }
    path = "/api/v1/tenants/acme/namespaces/dev/secrets/s"
    got = await apply(api, secret, path=path, code=201)
    assert got["data"] == {"user": "YWRtaW4="}
    assert "stringData" not in got
    assert "stringData" not in await stored(api, path)


@pytest.mark.parametrize(
    ("params", "code", "message"),
    [
        ({}, 422, "fieldManager: Required value: is required for apply patch"),
        ({"fieldManager": "m" * 129}, 422, "fieldManager: Too long"),
        ({"fieldManager": "a\u200bb"}, 422, "printable"),
        ({"fieldManager": "m", "force": "maybe"}, 400, "force"),
    ],
)
async def test_apply_options(
    api: aiohttp.ClientSession, params: dict[str, str], code: int, message: str
) -> None:
    resp = await api.patch(f"{CMS}/c", data=json.dumps(cm(a="1")), headers=APPLY, params=params)
    assert resp.status == code, await resp.text()
    assert message in (await resp.json())["message"]
    assert (await api.get(f"{CMS}/c")).status == 404


async def test_force_belongs_to_apply(api: aiohttp.ClientSession) -> None:
    await api.post(CMS, json=cm(a="1"))
    resp = await api.patch(f"{CMS}/c", json={"data": {"a": "2"}}, params={"force": "true"})
    assert resp.status == 422
    assert (await stored(api))["data"] == {"a": "1"}


MALFORMED = [
    b"data: [unclosed",  # not YAML
    b"- a\n- b\n",  # not a mapping
    b"",  # empty
    b"apiVersion: v1\nkind: Secret\nmetadata: {name: c}\n",  # another kind than the URL's
    b"kind: ConfigMap\nmetadata: {name: c}\n",  # no apiVersion
    b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\n",  # another name
    b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, managedFields: []}\n",
    b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: !!binary aGk=\n",
    b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: .nan}\n",
    b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {? [a, b] : c}\n",
    # aliases that would expand far beyond the body's size
    b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + b"".join(
        b"%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n" % ((c,) * 2 + (c - 1,) * 10)
        for c in range(ord("b"), ord("i"))
    ),
    b'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: "\\udfff"}\n',
]


@pytest.mark.parametrize("body", MALFORMED)
async def test_malformed_apply_bodies_are_400(api: aiohttp.ClientSession, body: bytes) -> None:
    await apply(api, cm(a="1"), code=201)
    before = await stored(api)
    status = await apply(api, body, code=400)
    assert (status["kind"], status["reason"]) == ("Status", "BadRequest")
    assert await stored(api) == before
    # nor does a missing object get created from one
    other = body.replace(b"name: c", b"name: d")
    await apply(api, other, path=f"{CMS}/d", code=400)
    assert (await api.get(f"{CMS}/d")).status == 404


async def test_apply_is_dry_runnable(api: aiohttp.ClientSession) -> None:
    resp = await api.patch(
        f"{CMS}/c",
        data=json.dumps(cm(a="1")),
        headers=APPLY,
        params={"fieldManager": "m", "dryRun": "All"},
    )
    assert resp.status == 201
    assert (await resp.json())["data"] == {"a": "1"}
    assert (await api.get(f"{CMS}/c")).status == 404


# -- any apply: an object or a 400/409, never another error ------------------------------

_KEYS = st.sampled_from(
    [
        "metadata",
        "labels",
        "finalizers",
        "data",
        "spec",
        "template",
        "containers",
        "name",
        "image",
        "ports",
        "containerPort",
        "protocol",
        "a",
    ]
)
_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["a", "b", "c"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    first=st.dictionaries(_KEYS, _VALUES, max_size=4),
    second=st.dictionaries(_KEYS, _VALUES, max_size=4),
    force=st.booleans(),
)
def test_any_apply_merges_or_conflicts(
    first: dict[str, Any], second: dict[str, Any], force: bool
) -> None:
    head = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    live = managed.apply(None, {**first, **head}, "Deployment", "one", "apps/v1", "t1", force=False)
    for manager in ("one", "two"):
        try:
            got = managed.apply(
                live, {**second, **head}, "Deployment", manager, "apps/v1", "t2", force=force
            )
        except StatusError as err:
            code = err.code
        else:
            code = 200
            json.dumps(got)
            assert managed.managers_of(got) or not managed.fields_of(got, "Deployment")
        assert code in (200, 409)
        assert code == 200 or (manager == "two" and not force)

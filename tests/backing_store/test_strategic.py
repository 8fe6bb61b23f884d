"""Strategic merge patch (backing_store/strategic.py): the Kubernetes patch merge keys
and directives, first as a function (cases from apimachinery's own semantics), then
through the store over HTTP, where the bug of issue 23 lived: `kubectl set image` on
one container of two deleted the other and stored `$setElementOrder/containers`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backing_store.errors import StatusError
from backing_store.strategic import strategic_merge
from tests.rigs import processes

HDRS = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}
DEPLOYS = "/apis/apps/v1/tenants/acme/namespaces/dev/deployments"
SMP = {"Content-Type": "application/strategic-merge-patch+json"}


def deployment(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}, "finalizers": ["a", "b"]},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": list(containers), **spec},
            },
        },
    }


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def template(**pod: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": pod}}}


APP = {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]}
SIDE = {"name": "side", "image": "side:1", "ports": [{"containerPort": 80}]}


# -- the function ---------------------------------------------------------------------


def test_set_image_patch_keeps_the_other_container_and_stores_no_directive() -> None:
    # what `kubectl set image deployment/web app=app:2` sends
    patch = template(
        **{
            "$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
            "containers": [{"image": "app:2", "name": "app"}],
        }
    )
    got = strategic_merge(deployment(APP, SIDE), patch, "Deployment")
    assert pod_spec(got)["containers"] == [{**APP, "image": "app:2"}, SIDE]
    assert "$setElementOrder/containers" not in json.dumps(got)


@pytest.mark.parametrize(
    ("patch", "want"),
    [
        # merge by name: a new container goes first (no $setElementOrder), as in Kubernetes
        (template(containers=[{"name": "new", "image": "n"}]), ["new", "app", "side"]),
        (
            template(
                **{
                    "$setElementOrder/containers": [
                        {"name": "app"},
                        {"name": "side"},
                        {"name": "new"},
                    ],
                    "containers": [{"name": "new", "image": "n"}],
                }
            ),
            ["app", "side", "new"],
        ),
        # reorder only
        (
            template(**{"$setElementOrder/containers": [{"name": "side"}, {"name": "app"}]}),
            ["side", "app"],
        ),
        (template(containers=[{"name": "app", "$patch": "delete"}]), ["side"]),
        (template(containers=[{"$patch": "replace"}, {"name": "only", "image": "o"}]), ["only"]),
    ],
)
def test_containers_merge_by_name(patch: dict[str, Any], want: list[str]) -> None:
    got = strategic_merge(deployment(APP, SIDE), patch, "Deployment")
    assert [c["name"] for c in pod_spec(got)["containers"]] == want
    assert "$" not in json.dumps(got)


def test_merge_keys_of_the_api_types() -> None:
    live = deployment(
        {**APP, "volumeMounts": [{"name": "v", "mountPath": "/a"}]},
        SIDE,
        tolerations=[{"key": "a"}],
        volumes=[{"name": "v", "emptyDir": {}}],
    )
    live["status"] = {"conditions": [{"type": "Available", "status": "True"}]}
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "env": [{"name": "B", "value": "2"}],
                            # volumeMounts merge by mountPath, not by name
                            "volumeMounts": [{"name": "v", "mountPath": "/b"}],
                        },
                        {"name": "side", "ports": [{"containerPort": 80, "name": "http"}]},
                    ],
                    "tolerations": [{"key": "b"}],  # no patch strategy: replaced
                    "volumes": [{"name": "w", "emptyDir": {}}],
                }
            }
        },
        "status": {"conditions": [{"type": "Progressing", "status": "True"}]},
        "metadata": {"finalizers": ["c"], "labels": {"tier": "x"}},
    }
    got = strategic_merge(live, patch, "Deployment")
    app, side = pod_spec(got)["containers"]
    assert app["env"] == [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]
    assert [m["mountPath"] for m in app["volumeMounts"]] == ["/b", "/a"]
    assert side["ports"] == [{"containerPort": 80, "name": "http"}]
    assert pod_spec(got)["tolerations"] == [{"key": "b"}]
    assert [v["name"] for v in pod_spec(got)["volumes"]] == ["w", "v"]
    assert [c["type"] for c in got["status"]["conditions"]] == ["Progressing", "Available"]
    assert got["metadata"]["finalizers"] == ["c", "a", "b"]  # a set: union
    assert got["metadata"]["labels"] == {"app": "web", "tier": "x"}


def test_map_directives_retain_keys_and_primitive_deletes() -> None:
    live = deployment(APP)
    live["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}
    patch = {
        "metadata": {
            "$deleteFromPrimitiveList/finalizers": ["a"],
            "labels": {"$patch": "replace", "only": "this"},
        },
        "spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}},
    }
    got = strategic_merge(live, patch, "Deployment")
    assert got["metadata"]["finalizers"] == ["b"]
    assert got["metadata"]["labels"] == {"only": "this"}
    assert got["spec"]["strategy"] == {"type": "Recreate"}
    got = strategic_merge(live, {"spec": {"selector": {"$patch": "delete"}}}, "Deployment")
    assert got["spec"]["selector"] == {}
    # a directive inside a value new to the object is applied, never copied
    fresh = {"spec": {"paused": {"a": {"$patch": "replace", "b": 1}, "c": None}}}
    assert strategic_merge(live, fresh, "Deployment")["spec"]["paused"] == {"a": {"b": 1}}


def test_kinds_without_merge_lists_replace_lists() -> None:
    server = {"kind": "Server", "metadata": {"name": "s"}, "tags": ["a"], "spec": {"x": [1, 2]}}
    got = strategic_merge(server, {"tags": ["b"], "spec": {"x": [3]}}, "Server")
    assert (got["tags"], got["spec"]) == (["b"], {"x": [3]})


BAD_PATCHES = [
    {"metadata": {"$frobnicate": 1}},  # unknown directive
    {"metadata": {"labels": {"$patch": "explode"}}},  # unknown $patch value
    template(containers=[{"name": "app", "$patch": "explode"}]),
    template(containers=[{"image": "no-name"}]),  # no merge key
    template(containers=[{"$patch": "delete"}]),  # a delete without its merge key
    template(containers=["app"]),  # not an object
    {"metadata": {"$retainKeys": "labels"}},
    {"metadata": {"$retainKeys": ["labels"], "annotations": {"a": "b"}}},
    {"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}},
    {"metadata": {"$deleteFromPrimitiveList/labels": ["a"]}},  # not a set list
    {"metadata": {"$setElementOrder/finalizers": "a"}},
    {"spec": {"$setElementOrder/selector": [{"name": "x"}]}},  # not a merge list
    template(
        **{
            "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
            "containers": [{"name": "app", "image": "x"}, {"name": "side", "image": "y"}],
        }
    ),  # patch order against its own order list
    {"metadata": {"finalizers": [{"a": 1}]}},  # objects in a list of scalars
    {"$setElementOrder/": []},
]


@pytest.mark.parametrize("patch", BAD_PATCHES)
def test_bad_patches_are_400(patch: dict[str, Any]) -> None:
    with pytest.raises(StatusError) as err:
        strategic_merge(deployment(APP, SIDE), patch, "Deployment")
    assert err.value.code == 400


# -- through the store ------------------------------------------------------------------


@pytest.fixture
async def api(store: processes.Proc) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(store.url, headers=HDRS) as session:
        for path, name in (("/api/v1/tenants", "acme"), ("/api/v1/tenants/acme/namespaces", "dev")):
            assert (await session.post(path, json={"metadata": {"name": name}})).status == 201
        yield session


async def test_the_store_applies_a_strategic_merge_patch(api: aiohttp.ClientSession) -> None:
    assert (await api.post(DEPLOYS, json=deployment(APP, SIDE))).status == 201
    patch = template(
        **{
            "$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
            "containers": [{"image": "app:2", "name": "app"}],
        }
    )
    resp = await api.patch(f"{DEPLOYS}/web", data=json.dumps(patch), headers=SMP)
    assert resp.status == 200, await resp.text()
    stored = await (await api.get(f"{DEPLOYS}/web")).json()
    assert pod_spec(stored)["containers"] == [{**APP, "image": "app:2"}, SIDE]
    assert "$setElementOrder" not in json.dumps(stored)
    assert stored == await resp.json()


@pytest.mark.parametrize("patch", BAD_PATCHES)
async def test_the_store_refuses_a_bad_strategic_patch(
    api: aiohttp.ClientSession, patch: dict[str, Any]
) -> None:
    assert (await api.post(DEPLOYS, json=deployment(APP, SIDE))).status == 201
    before = await (await api.get(f"{DEPLOYS}/web")).json()
    for params in ({}, {"dryRun": "All"}):
        resp = await api.patch(f"{DEPLOYS}/web", data=json.dumps(patch), headers=SMP, params=params)
        assert resp.status == 400, await resp.text()
        status = await resp.json()
        assert (status["kind"], status["reason"]) == ("Status", "BadRequest")
        assert status["message"].startswith("strategic merge patch: ")
    assert await (await api.get(f"{DEPLOYS}/web")).json() == before


# -- any patch: a result or a 400, never another error ----------------------------------

_KEYS = st.sampled_from(
    [
        "metadata",
        "finalizers",
        "labels",
        "spec",
        "template",
        "containers",
        "name",
        "image",
        "env",
        "ports",
        "containerPort",
        "volumes",
        "strategy",
        "$patch",
        "$retainKeys",
        "$setElementOrder/containers",
        "$setElementOrder/finalizers",
        "$deleteFromPrimitiveList/finalizers",
        "$setElementOrder/env",
    ]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["app", "side", "replace", "delete", "merge", "x", "$patch"]),
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(
    patch=st.dictionaries(_KEYS, JSON, max_size=4), live=st.dictionaries(_KEYS, JSON, max_size=3)
)
def test_any_patch_merges_or_is_400(patch: dict[str, Any], live: dict[str, Any]) -> None:
    tries = [(deployment(APP, SIDE), patch), ({**deployment(APP, SIDE), **live}, patch)]
    tries.append((deployment(APP, SIDE), template(**patch)))  # at the pod spec's level
    for original, change in tries:
        try:
            got = strategic_merge(original, change, "Deployment")
        except StatusError as err:
            code = err.code
        else:
            code = 200
            assert isinstance(got, dict)
            json.dumps(got)  # plain JSON values only
        assert code in (200, 400)

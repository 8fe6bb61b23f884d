"""The store reads JSON only (DESIGN §10), over HTTP against the real store process:
another request `Content-Type` is 415 with a Status body and nothing is stored; a body
without `Content-Type` is read as JSON (curl-friendly); the JSON patch types apply."""

from __future__ import annotations

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
# A ConfigMap in the Kubernetes protobuf envelope ("k8s\0" + Unknown{typeMeta, raw}).
PROTOBUF = b"k8s\x00\n\x0f\n\x02v1\x12\tConfigMap\x12\x0b\n\t\n\x02c1\x12\x00"
OTHER_TYPES = [
    ("application/vnd.kubernetes.protobuf", PROTOBUF),
    ("application/cbor", b"\xa1\x68metadata\xa1\x64name\x62c1"),
    ("application/yaml", b"metadata: {name: c1}\n"),
    ("text/plain", b'{"metadata": {"name": "c1"}}'),
    ("application/x-www-form-urlencoded", b"metadata=c1"),
]


@pytest.fixture
async def api(store: processes.Proc) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(store.url, headers=HDRS) as session:
        assert (
            await session.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})
        ).status == 201
        assert (await session.post(NS, json={"metadata": {"name": "dev"}})).status == 201
        yield session


async def expect_415(resp: aiohttp.ClientResponse) -> None:
    assert resp.status == 415, await resp.text()
    body: dict[str, Any] = await resp.json()
    assert body["kind"] == "Status"
    assert body["code"] == 415
    assert body["reason"] == "UnsupportedMediaType"
    assert "JSON" in body["message"]


async def names(api: aiohttp.ClientSession, path: str) -> list[str]:
    resp = await api.get(path)
    assert resp.status == 200
    return [i["metadata"]["name"] for i in (await resp.json())["items"]]


@pytest.mark.parametrize(("ctype", "body"), OTHER_TYPES)
async def test_non_json_bodies_are_415(api: aiohttp.ClientSession, ctype: str, body: bytes) -> None:
    await api.post(CMS, json={"metadata": {"name": "keep"}, "data": {"a": "1"}})
    headers = {"Content-Type": ctype}
    await expect_415(await api.post(CMS, data=body, headers=headers))
    await expect_415(await api.post(CMS, data=body, headers=headers, params={"dryRun": "All"}))
    await expect_415(await api.put(f"{CMS}/keep", data=body, headers=headers))
    await expect_415(await api.patch(f"{CMS}/keep", data=body, headers=headers))
    await expect_415(await api.delete(f"{CMS}/keep", data=body, headers=headers))
    await expect_415(await api.delete(CMS, data=body, headers=headers))
    await expect_415(await api.put(f"{CMS}/keep/status", data=body, headers=headers))
    await expect_415(await api.post("/api/v1/tenants", data=body, headers=headers))
    assert await names(api, CMS) == ["keep"]
    got = await (await api.get(f"{CMS}/keep")).json()
    assert got["data"] == {"a": "1"}


@pytest.mark.parametrize(
    ("method", "path", "ctype"),
    [
        ("POST", CMS, "application/apply-patch+yaml"),
        ("PUT", f"{CMS}/keep", "application/apply-patch+yaml"),
        ("PATCH", f"{CMS}/keep/status", "application/apply-patch+yaml"),
        ("PATCH", f"{CMS}/keep", "application/apply-patch+cbor"),
    ],
)
async def test_apply_bodies_only_patch_an_object(
    api: aiohttp.ClientSession, method: str, path: str, ctype: str
) -> None:
    """Server-side apply is a PATCH of an object (tests/backing_store/test_apply.py);
    anywhere else its YAML body is a body the store does not read."""
    await api.post(CMS, json={"metadata": {"name": "keep"}, "data": {"a": "1"}})
    resp = await api.request(
        method,
        path,
        data=b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: keep}\ndata: {a: b}\n",
        headers={"Content-Type": ctype},
        params={"fieldManager": "m"},
    )
    await expect_415(resp)
    assert (await (await api.get(f"{CMS}/keep")).json())["data"] == {"a": "1"}
    assert await names(api, CMS) == ["keep"]


DEEP = 2000
UNKEEPABLE = [
    # JSON escapes that decode to lone UTF-16 surrogates: no UTF-8 answer can hold them
    b'{"metadata": {"name": "s"}, "data": {"a": "\\udfff"}}',
    b'{"metadata": {"name": "s"}, "data": {"\\ud800": "a"}}',
    b'{"metadata": {"name": "s", "labels": {"a": "b"}}, "data": {"a": "x\\ud83dy"}}',
    # nesting deeper than any object (and than Python's recursion limit)
    b'{"metadata": {"name": "s"}, "data": {"a": ' + b"[" * DEEP + b"]" * DEEP + b"}}",
    b'{"metadata": {"name": "s"}, "spec": ' + b'{"a": ' * 150 + b"1" + b"}" * 150 + b"}",
    # numbers JSON cannot carry (issue 28): stored, they made every list unreadable
    b'{"metadata": {"name": "s"}, "data": {"a": 1e400}}',
    b'{"metadata": {"name": "s"}, "data": {"a": -Infinity}}',
    b'{"metadata": {"name": "s"}, "data": {"a": ' + b"9" * 400 + b"}}",
    b'{"metadata": {"name": "s"}, "data": {"a": ' + b"9" * 5000 + b"}}",
]


@pytest.mark.parametrize("raw", UNKEEPABLE)
async def test_bodies_the_store_cannot_keep_are_400(api: aiohttp.ClientSession, raw: bytes) -> None:
    """Found by a hostile review: `"\\udfff"` was stored, then every answer holding it
    was a 500; a deep body was a RecursionError (500) too."""
    await api.post(CMS, json={"metadata": {"name": "s"}, "data": {"a": "1"}})
    bodies = {
        ("POST", CMS, "application/json"): raw.replace(b'"s"', b'"t"'),
        ("PUT", f"{CMS}/s", "application/json"): raw,
        ("PATCH", f"{CMS}/s", "application/merge-patch+json"): raw,
        ("PATCH", f"{CMS}/s", "application/strategic-merge-patch+json"): raw,
        ("PATCH", f"{CMS}/s?fieldManager=m", "application/apply-patch+yaml"): raw.replace(
            b"{", b'{"apiVersion": "v1", "kind": "ConfigMap", ', 1
        ),
        (
            "PATCH",
            f"{CMS}/s",
            "application/json-patch+json",
        ): b'[{"op": "add", "path": "/data/b", "value": ' + raw + b"}]",
    }
    for (method, path, ctype), body in bodies.items():
        resp = await api.request(method, path, data=body, headers={"Content-Type": ctype})
        assert resp.status == 400, (method, ctype, await resp.text())
        status = await resp.json()
        assert (status["kind"], status["code"]) == ("Status", 400)
    assert await names(api, CMS) == ["s"]
    assert (await (await api.get(f"{CMS}/s")).json())["data"] == {"a": "1"}


YAML_NUMBERS = [".inf", "-.inf", ".nan", "1.0e+400", "9" * 400, "9" * 5000]


@pytest.mark.parametrize("number", YAML_NUMBERS, ids=lambda n: n[:12])
async def test_yaml_numbers_json_cannot_carry_are_400(
    api: aiohttp.ClientSession, number: str
) -> None:
    """An apply body's YAML number beyond a float (a 5000-digit one was a 500) or not a
    number at all is a 400 naming it; nothing stored, whether the apply creates or
    patches."""
    await api.post(CMS, json={"metadata": {"name": "s"}, "data": {"a": "1"}})
    for name in ("s", "new"):
        text = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\nx: {number}\n"
        resp = await api.patch(
            f"{CMS}/{name}?fieldManager=m",
            data=text.encode(),
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        assert resp.status == 400, (name, await resp.text())
        status = await resp.json()
        assert "a number JSON cannot carry" in status["message"], status
    assert await names(api, CMS) == ["s"]
    assert (await (await api.get(f"{CMS}/s")).json())["data"] == {"a": "1"}


async def test_a_surrogate_pair_is_a_character(api: aiohttp.ClientSession) -> None:
    raw = b'{"metadata": {"name": "e"}, "data": {"a": "\\ud83d\\ude00"}}'
    resp = await api.post(CMS, data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 201, await resp.text()
    assert (await (await api.get(f"{CMS}/e")).json())["data"] == {"a": "\U0001f600"}


async def test_body_without_content_type_is_json(api: aiohttp.ClientSession) -> None:
    raw = json.dumps({"metadata": {"name": "curl"}, "data": {"a": "1"}}).encode()
    resp = await api.post(CMS, data=raw, skip_auto_headers=["Content-Type"])
    assert resp.status == 201, await resp.text()
    # PATCH without Content-Type is a merge patch
    resp = await api.patch(
        f"{CMS}/curl", data=b'{"data": {"b": "2"}}', skip_auto_headers=["Content-Type"]
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["data"] == {"a": "1", "b": "2"}
    # an empty write without Content-Type (DELETE) is fine too
    resp = await api.delete(f"{CMS}/curl", skip_auto_headers=["Content-Type"])
    assert resp.status == 200


async def test_json_with_parameters_and_an_empty_typed_body(api: aiohttp.ClientSession) -> None:
    raw = json.dumps({"metadata": {"name": "c"}}).encode()
    resp = await api.post(
        CMS, data=raw, headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert resp.status == 201, await resp.text()
    # a DELETE that names a type but has no body is not a body to refuse
    resp = await api.delete(f"{CMS}/c", headers={"Content-Type": "text/plain"})
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(
    ("ctype", "patch", "want"),
    [
        ("application/merge-patch+json", {"data": {"a": None, "b": "2"}}, {"b": "2"}),
        ("application/strategic-merge-patch+json", {"data": {"b": "2"}}, {"a": "1", "b": "2"}),
        ("application/json", {"data": {"b": "2"}}, {"a": "1", "b": "2"}),
        (
            "application/json-patch+json",
            [
                {"op": "test", "path": "/data/a", "value": "1"},
                {"op": "add", "path": "/data/b", "value": "2"},
                {"op": "move", "from": "/data/a", "path": "/data/c"},
            ],
            {"b": "2", "c": "1"},
        ),
    ],
)
async def test_json_patch_types_apply(
    api: aiohttp.ClientSession, ctype: str, patch: Any, want: dict[str, str]
) -> None:
    await api.post(CMS, json={"metadata": {"name": "p"}, "data": {"a": "1"}})
    resp = await api.patch(f"{CMS}/p", data=json.dumps(patch), headers={"Content-Type": ctype})
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["data"] == want
    assert (await (await api.get(f"{CMS}/p")).json())["data"] == want


@pytest.mark.parametrize(
    ("ops", "code"),
    [
        ({"op": "add"}, 400),  # not an array
        ([{"op": "frobnicate", "path": "/a"}], 400),
        ([{"op": "add", "path": "data"}], 400),  # not a JSON pointer
        ([{"op": "add", "path": "/data/x"}], 400),  # no value
        ([{"op": "test", "path": "/data/a", "value": "2"}], 422),
        ([{"op": "remove", "path": "/data/nope"}], 422),
        ([{"op": "replace", "path": "/spec/x", "value": 1}], 422),
        ([{"op": "add", "path": "/metadata/name", "value": "other"}], 400),  # name vs URL
        ([{"op": "replace", "path": "", "value": []}], 400),  # not an object any more
    ],
)
async def test_bad_json_patches(api: aiohttp.ClientSession, ops: Any, code: int) -> None:
    await api.post(CMS, json={"metadata": {"name": "p"}, "data": {"a": "1"}})
    resp = await api.patch(
        f"{CMS}/p", data=json.dumps(ops), headers={"Content-Type": "application/json-patch+json"}
    )
    assert resp.status == code, await resp.text()
    assert (await resp.json())["kind"] == "Status"
    assert (await (await api.get(f"{CMS}/p")).json())["data"] == {"a": "1"}


async def test_json_patch_on_server_tags_and_status(api: aiohttp.ClientSession) -> None:
    await api.post(SERVERS, json={"metadata": {"name": "s"}, "tags": ["a"]})
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/tags/-", "value": "b"}]
    resp = await api.patch(
        f"{SERVERS}/s",
        data=json.dumps(ops),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert resp.status == 200
    assert (await resp.json())["tags"] == ["a", "b"]
    tags = await (await api.get(f"{SERVERS}/s/tags")).json()
    assert tags == {"tags": ["a", "b"]}
    filtered = await (await api.get(SERVERS, params={"tags": "b"})).json()
    assert [i["metadata"]["name"] for i in filtered["items"]] == ["s"]
    ops = [{"op": "add", "path": "/status", "value": {"phase": "up"}}]
    resp = await api.patch(
        f"{SERVERS}/s/status",
        data=json.dumps(ops),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert resp.status == 200
    assert (await resp.json())["status"] == {"phase": "up"}

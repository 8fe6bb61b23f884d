"""Backing store over HTTP: Nova tags on servers (DESIGN §10) — status codes, limits,
validation, tags on the object, and the list filters with the design's semantics."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from backing_store.app import make_app

Client = TestClient[web.Request, web.Application]

SERVERS = "/apis/compute/v1/tenants/acme/namespaces/dev/servers"
WEB = f"{SERVERS}/web1"


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Any) -> Client:
    c: Client = await aiohttp_client(make_app(str(tmp_path / "store.db")))
    assert (await c.post("/api/v1/tenants", json={"metadata": {"name": "acme"}})).status == 201
    ns = {"metadata": {"name": "dev"}}
    assert (await c.post("/api/v1/tenants/acme/namespaces", json=ns)).status == 201
    assert (await c.post(SERVERS, json={"metadata": {"name": "web1"}})).status == 201
    return c


async def tags_of(client: Client, path: str = WEB) -> list[str]:
    resp = await client.get(f"{path}/tags")
    assert resp.status == 200
    tags: list[str] = (await resp.json())["tags"]
    obj = await (await client.get(path)).json()
    assert obj["tags"] == tags  # the object shows its tags
    return tags


async def bad(resp: Any) -> None:
    assert resp.status == 400, await resp.text()
    body = await resp.json()
    assert body["kind"] == "Status"
    assert body["code"] == 400
    assert body["message"]


async def test_single_tag_status_codes(client: Client) -> None:
    resp = await client.put(f"{WEB}/tags/red")
    assert resp.status == 201
    assert resp.headers["Location"].endswith("/servers/web1/tags/red")
    assert (await client.put(f"{WEB}/tags/red")).status == 204
    assert (await client.get(f"{WEB}/tags/red")).status == 204
    assert (await client.get(f"{WEB}/tags/Red")).status == 404  # case-sensitive
    assert (await client.put(f"{WEB}/tags/Red")).status == 201
    assert await tags_of(client) == ["red", "Red"]
    assert (await client.delete(f"{WEB}/tags/red")).status == 204
    assert (await client.delete(f"{WEB}/tags/red")).status == 404
    assert (await client.get(f"{WEB}/tags/red")).status == 404
    assert await tags_of(client) == ["Red"]
    assert (await client.put(f"{SERVERS}/nope/tags/red")).status == 404


async def test_replace_all_and_delete_all(client: Client) -> None:
    resp = await client.put(f"{WEB}/tags", json={"tags": ["a", "b", "a"]})
    assert resp.status == 200
    assert await resp.json() == {"tags": ["a", "b"]}
    rv = (await (await client.get(WEB)).json())["metadata"]["resourceVersion"]
    assert await tags_of(client) == ["a", "b"]
    resp = await client.put(f"{WEB}/tags", json={"tags": ["c"]})
    assert await resp.json() == {"tags": ["c"]}
    after = (await (await client.get(WEB)).json())["metadata"]["resourceVersion"]
    assert int(after) > int(rv)
    assert (await client.delete(f"{WEB}/tags")).status == 204
    assert await tags_of(client) == []


async def test_tags_on_create_and_update(client: Client) -> None:
    resp = await client.post(SERVERS, json={"metadata": {"name": "web2"}, "tags": ["x", "y"]})
    assert resp.status == 201
    assert (await resp.json())["tags"] == ["x", "y"]
    assert await tags_of(client, f"{SERVERS}/web2") == ["x", "y"]
    # an update without "tags" keeps them; with "tags" replaces them
    resp = await client.put(f"{SERVERS}/web2", json={"metadata": {"name": "web2"}, "spec": {}})
    assert (await resp.json())["tags"] == ["x", "y"]
    resp = await client.patch(f"{SERVERS}/web2", json={"tags": ["z"]})
    assert (await resp.json())["tags"] == ["z"]
    assert await tags_of(client, f"{SERVERS}/web2") == ["z"]
    names = [
        i["metadata"]["name"]
        for i in (await (await client.get(SERVERS, params={"tags": "z"})).json())["items"]
    ]
    assert names == ["web2"]
    await bad(await client.post(SERVERS, json={"metadata": {"name": "w3"}, "tags": ["ok", ""]}))
    await bad(await client.post(SERVERS, json={"metadata": {"name": "w3"}, "tags": "a"}))
    await bad(await client.patch(f"{SERVERS}/web2", json={"tags": ["a/b"]}))
    assert (await client.get(f"{SERVERS}/w3")).status == 404
    assert await tags_of(client, f"{SERVERS}/web2") == ["z"]
    # only servers take tags
    pods = "/api/v1/tenants/acme/namespaces/dev/pods"
    await bad(await client.post(pods, json={"metadata": {"name": "p"}, "tags": ["a"]}))


@pytest.mark.parametrize(
    "tags",
    [
        [""],
        ["x" * 61],
        ["é" * 31],  # 31 characters, 62 bytes of UTF-8
        ["a/b"],
        ["a,b"],
        [1],
        [None],
        [["nested"]],
        [f"t{i}" for i in range(51)],
    ],
)
async def test_bad_tag_lists_are_400_and_store_nothing(client: Client, tags: list[Any]) -> None:
    await client.put(f"{WEB}/tags", json={"tags": ["keep"]})
    await bad(await client.put(f"{WEB}/tags", json={"tags": tags}))
    await bad(await client.post(SERVERS, json={"metadata": {"name": "new"}, "tags": tags}))
    assert await tags_of(client) == ["keep"]
    assert (await client.get(f"{SERVERS}/new")).status == 404


async def test_tag_limits_at_the_edge(client: Client) -> None:
    edge = ["x" * 60, "é" * 30]  # exactly 60 bytes each
    resp = await client.put(f"{WEB}/tags", json={"tags": edge})
    assert resp.status == 200
    fifty = [f"t{i}" for i in range(50)]
    assert (await client.put(f"{WEB}/tags", json={"tags": fifty})).status == 200
    assert (await client.put(f"{WEB}/tags/t7")).status == 204  # already there, even at 50
    await bad(await client.put(f"{WEB}/tags/t50"))  # a 51st
    assert len(await tags_of(client)) == 50


@pytest.mark.parametrize(
    "path",
    [
        f"{WEB}/tags/a%2Fb",
        f"{WEB}/tags/a,b",
        f"{WEB}/tags/{'x' * 61}",
        f"{WEB}/tags/{'%C3%A9' * 31}",
    ],
)
async def test_bad_single_tags_in_the_url_are_400(client: Client, path: str) -> None:
    await bad(await client.put(path))
    await bad(await client.get(path))
    assert await tags_of(client) == []


@pytest.mark.parametrize(
    "body",
    [["a"], {"tags": "a"}, {"tags": ["a"], "extra": 1}, {}, {"tag": ["a"]}, "tags", None],
)
async def test_replace_all_body_must_be_exactly_tags_list(client: Client, body: Any) -> None:
    await bad(await client.put(f"{WEB}/tags", json=body))
    assert await tags_of(client) == []


async def test_bad_filters_are_400(client: Client) -> None:
    await bad(await client.get(SERVERS, params={"tags": ""}))
    await bad(await client.get(SERVERS, params={"tags-any": "a,,b"}))
    await bad(await client.get(SERVERS, params={"not-tags": "x" * 61}))
    await bad(await client.get("/api/v1/tenants/acme/pods", params={"tags": "a"}))


# --- filter semantics ------------------------------------------------------------------

UNIVERSE = ("a", "b", "c")
SUBSETS = [frozenset(s) for n in range(4) for s in itertools.combinations(UNIVERSE, n)]


def sname(tags: frozenset[str]) -> str:
    return "s-" + ("".join(sorted(tags)) or "none")


@pytest.fixture
async def tagged(client: Client) -> Client:
    """One server per subset of {a, b, c} (plus web1 without tags, removed)."""
    await client.delete(WEB)
    for subset in SUBSETS:
        body = {"metadata": {"name": sname(subset)}, "tags": sorted(subset)}
        assert (await client.post(SERVERS, json=body)).status == 201
    return client


async def listed(client: Client, params: dict[str, str], path: str = SERVERS) -> set[str]:
    resp = await client.get(path, params=params)
    assert resp.status == 200, await resp.text()
    return {i["metadata"]["name"] for i in (await resp.json())["items"]}


def oracle(params: dict[str, str]) -> set[str]:
    """DESIGN §10 in plain set logic."""
    out = set()
    for subset in SUBSETS:
        ok = True
        for name, value in params.items():
            want = set(value.split(","))
            hits = len(subset & want)
            ok &= {
                "tags": hits == len(want),
                "tags-any": hits > 0,
                "not-tags": hits == 0,
                "not-tags-any": hits < len(want),
            }[name]
        if ok:
            out.add(sname(subset))
    return out


async def test_the_four_filters_follow_the_design_text(tagged: Client) -> None:
    got = {
        f: await listed(tagged, {f: "a,b"})
        for f in ("tags", "tags-any", "not-tags", "not-tags-any")
    }
    assert got["tags"] == {"s-ab", "s-abc"}
    assert got["tags-any"] == {"s-a", "s-b", "s-ab", "s-ac", "s-bc", "s-abc"}
    assert got["not-tags"] == {"s-none", "s-c"}  # neither a nor b (Nova's code inverts this)
    assert got["not-tags-any"] == {"s-none", "s-a", "s-b", "s-c", "s-ac", "s-bc"}
    assert len({frozenset(v) for v in got.values()}) == 4  # every filter gives a different answer


async def test_every_filter_combination_matches_the_design(tagged: Client) -> None:
    filters = ("tags", "tags-any", "not-tags", "not-tags-any")
    values = ("a", "a,b", "b,c")
    answers: dict[tuple[tuple[str, str], ...], frozenset[str]] = {}
    for n in (1, 2):
        for chosen in itertools.combinations(filters, n):
            for vals in itertools.product(values, repeat=n):
                params = dict(zip(chosen, vals, strict=True))
                got = await listed(tagged, params)
                assert got == oracle(params), params
                answers[tuple(params.items())] = frozenset(got)
    # the data set tells every single filter apart (with one tag, tags == tags-any and
    # not-tags == not-tags-any by definition, so compare the two-tag values)
    singles = [v for k, v in answers.items() if len(k) == 1 and "," in k[0][1]]
    assert len(singles) == 8
    assert len(set(singles)) == len(singles)


async def test_contradictions_give_an_empty_200_list(tagged: Client) -> None:
    assert await listed(tagged, {"tags": "a", "not-tags": "a"}) == set()
    assert await listed(tagged, {"tags-any": "a,b", "not-tags": "a,b"}) == set()


async def test_filters_page_and_work_tenant_and_cluster_wide(tagged: Client) -> None:
    seen: list[str] = []
    token = ""
    while True:
        params = {"tags-any": "a,c", "limit": "2", **({"continue": token} if token else {})}
        body = await (await tagged.get("/apis/compute/v1/servers", params=params)).json()
        seen += [i["metadata"]["name"] for i in body["items"]]
        token = body["metadata"].get("continue", "")
        if not token:
            break
    assert sorted(seen) == sorted(oracle({"tags-any": "a,c"}))
    assert len(seen) == len(set(seen))
    tenant_wide = await listed(tagged, {"not-tags": "a"}, "/apis/compute/v1/tenants/acme/servers")
    assert tenant_wide == oracle({"not-tags": "a"})

"""Policy file reading: the fast event-built values equal the general node-built ones,
values and line numbers alike, and odd YAML falls back or reports a problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.policy import files
from sidecar.policy.files import Node, NodeList, parse_yaml_documents
from tests.rigs import paths
from tests.rigs.waiting import eventually

ROOT = paths.ROOT


def assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, Node):
        assert (a.line, a.key_lines, list(a)) == (b.line, b.key_lines, list(b))
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, NodeList):
        assert (a.line, a.item_lines, len(a)) == (b.line, b.item_lines, len(b))
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def assert_paths_agree(text: str) -> None:
    fast = files._values_from_events(text)
    slow = files._values_from_nodes(text)
    assert [line for _, line in fast] == [line for _, line in slow]
    for (a, _), (b, _) in zip(fast, slow, strict=True):
        assert_same(a, b)


def test_shipped_policies_and_fixtures_parse_identically() -> None:
    paths = sorted(ROOT.glob("policies/**/*.yaml")) + sorted(ROOT.glob("tests/**/*.yaml"))
    assert len(paths) > 20
    for path in paths:
        text = path.read_text()
        try:
            files._values_from_events(text)
        except yaml.YAMLError:
            continue  # bad-policy fixtures: both paths must fail, checked below
        assert_paths_agree(text)


def test_scalars_anchors_aliases_and_block_text() -> None:
    assert_paths_agree(
        "a: &x {b: [1, 2.5, true, null, 2026-01-01, '3', \"q\", 0x1f, ~, yes, -7]}\n"
        "c: *x\nd: |\n  block\n  text\ne: >\n  folded\n---\n---\nk: !!str 5\nz: [&y 7, *y]\n"
        "? complex\n: value\n1: int key\n"
    )


def test_merge_keys_fall_back_to_the_node_path() -> None:
    docs, problems = parse_yaml_documents("kind: X\nbase: &b {x: 1}\nm: {<<: *b, y: 2}\n", "f")
    assert problems == []
    assert docs[0].body["m"] == {"x": 1, "y": 2}


def test_duplicate_keys_and_bad_yaml_are_problems_with_lines() -> None:
    _, problems = parse_yaml_documents("kind: A\nmetadata: {}\nkind: B\n", "f.yaml")
    assert [str(p) for p in problems] == ["f.yaml:3: not valid YAML: duplicate key 'kind'"]
    _, problems = parse_yaml_documents("kind: A\nrules: [unclosed\n", "g.yaml")
    assert len(problems) == 1
    assert problems[0].file == "g.yaml"
    assert "not valid YAML" in problems[0].message
    _, problems = parse_yaml_documents("kind: A\nx: *nowhere\n", "h.yaml")
    assert len(problems) == 1
    assert "undefined alias" in problems[0].message
    docs, problems = parse_yaml_documents("- a\n---\nkind: B\n---\nmetadata: {}\n", "i.yaml")
    assert [d.kind for d in docs] == ["B"]
    assert [str(p) for p in problems] == [
        "i.yaml:1: a policy document must be a mapping",
        "i.yaml:5: document has no 'kind'",
    ]


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["yes", "no", "on", "~", "1e3", "0o17", "<<x", "*"]),
)
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=4),
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(_tree, min_size=1, max_size=3), flow=st.booleans())
def test_random_documents_parse_identically(docs: list[Any], flow: bool) -> None:
    text = yaml.safe_dump_all(docs, default_flow_style=flow, allow_unicode=True)
    assert_paths_agree(text)


# -- the revision (DESIGN §5: relative paths and contents) -----------------------------


def test_revision_is_the_same_tree_wherever_it_is_mounted(tmp_path: Path) -> None:
    import os
    import shutil

    shipped = ROOT / "policies"
    copy = tmp_path / "mounted" / "elsewhere"
    shutil.copytree(shipped, copy)
    rev = files.load_documents([shipped]).revision
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        spellings = ["policies", "./policies/", "policies/../policies", str(shipped)]
        assert {files.load_documents([p]).revision for p in spellings} == {rev}
    finally:
        os.chdir(cwd)
    assert files.load_documents([copy]).revision == rev
    # A renamed file or a changed byte is another revision.
    (copy / "00-cluster-admin.yaml").rename(copy / "01-cluster-admin.yaml")
    renamed = files.load_documents([copy]).revision
    assert renamed != rev
    (copy / "80-modes.yaml").write_text((copy / "80-modes.yaml").read_text() + "\n# x\n")
    assert files.load_documents([copy]).revision not in (rev, renamed)


async def test_explain_readyz_and_audit_print_one_revision(tmp_path: Path) -> None:
    """`policy explain` on the tree as spelled here, the sidecar serving it through
    another spelling: /readyz and the audit log name the revision explain prints."""
    import json

    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    from sidecar.app import build_app
    from sidecar.config import load_config
    from sidecar.context import Identity
    from sidecar.policy.bundle import load_bundle
    from sidecar.policy.explain import explain

    bundle, _ = load_bundle(
        ["policies"] if (Path.cwd() / "policies").is_dir() else [ROOT / "policies"]
    )
    said = explain(bundle, Identity("admin", "system"), "GET", "/version")["revision"]

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"major": "1"})

    up_app = web.Application()
    up_app.router.add_route("*", "/{tail:.*}", ok)
    upstream = TestServer(up_app, host="127.0.0.1")
    await upstream.start_server()
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"token": "t", "user": "admin", "tenant": "system"}]))
    audit = tmp_path / "audit.log"
    config = load_config(
        None,
        env={},
        overrides={
            "upstream": f"http://127.0.0.1:{upstream.port}",
            "policies": str(ROOT / "policies" / ".." / "policies"),
            "identity.tokenFile": str(tokens),
            "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
            "audit.path": str(audit),
            "reload.enabled": False,
        },
    )
    sidecar = TestServer(build_app(config), host="127.0.0.1")
    await sidecar.start_server()
    try:
        async with ClientSession() as http:
            base = f"http://127.0.0.1:{sidecar.port}"
            async with http.get(base + "/readyz") as r:
                detail = (await r.json())["checks"]["policy"]["detail"]
            assert f"revision {said} " in detail
            async with http.get(base + "/version", headers={"Authorization": "Bearer t"}) as r:
                assert r.status == 200

        def version_records() -> list[dict[str, Any]]:
            text = audit.read_text() if audit.exists() else ""
            return [json.loads(line) for line in text.splitlines() if '"/version"' in line]

        records = await eventually(version_records, what="the /version audit record")
        assert records[-1]["revision"] == said
    finally:
        await sidecar.close()
        await upstream.close()

"""Policy file reading: libyaml's safe loading with the line of every mapping key and
sequence item, multi-document files, and every problem reported as `file:line`."""

from __future__ import annotations

import gc
import random
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.bench_policy import generate
from sidecar.policy.source import files
from sidecar.policy.source.files import Node, NodeList, collector_paused, parse_yaml_documents
from tests.rigs import paths
from tests.rigs.waiting import eventually

ROOT = paths.ROOT

SAMPLE = """\
# a comment
kind: ClusterRole
metadata: {name: view, labels: {team: a-b, 'x y': "z"}}
rules:
- apiGroups: ['', compute]
  resources: [pods, services/log, '*']   # trailing comment
  verbs: [get, list, watch, ]
- nonResourceURLs: ["/version", /healthz]
  verbs:
  - get
  - head
---
kind: TenantRoleBinding
metadata:
  tenant: acme
  name: b0
subjects:
  - {kind: User, name: alice}
  -   kind: ServiceAccount
      name: robot
empty:
numbers: [1, 0x1f, 1.5, 2026-01-01, ~, yes]
quoted: 'it''s # not a comment'
"""


def plain(value: Any) -> Any:
    """`value` with its Nodes and NodeLists as plain dicts and lists."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def lines(value: Any) -> Any:
    """Every line a value remembers, as nested plain data (for exact comparisons)."""
    if isinstance(value, Node):
        return (value.line, {k: (value.key_lines[k], lines(v)) for k, v in value.items()})
    if isinstance(value, NodeList):
        return (value.line, [(n, lines(v)) for n, v in zip(value.item_lines, value, strict=True)])
    return None


def test_documents_values_and_lines() -> None:
    docs, problems = parse_yaml_documents(SAMPLE, "f.yaml")
    assert problems == []
    assert [(d.kind, d.name, d.line, d.file) for d in docs] == [
        ("ClusterRole", "view", 2, "f.yaml"),
        ("TenantRoleBinding", "b0", 13, "f.yaml"),
    ]
    role, binding = docs
    assert plain(role.body["rules"]) == [
        {"apiGroups": ["", "compute"], "resources": ["pods", "services/log", "*"],
         "verbs": ["get", "list", "watch"]},
        {"nonResourceURLs": ["/version", "/healthz"], "verbs": ["get", "head"]},
    ]  # fmt: skip
    assert lines(role.body) == (
        2,
        {
            "kind": (2, None),
            "metadata": (3, (3, {"name": (3, None), "labels": (3, (3, {"team": (3, None),
                                                                      "x y": (3, None)}))})),
            "rules": (4, (5, [
                (5, (5, {"apiGroups": (5, (5, [(5, None), (5, None)])),
                         "resources": (6, (6, [(6, None)] * 3)),
                         "verbs": (7, (7, [(7, None)] * 3))})),
                (8, (8, {"nonResourceURLs": (8, (8, [(8, None)] * 2)),
                         "verbs": (9, (10, [(10, None), (11, None)]))})),
            ])),
        },
    )  # fmt: skip
    body = binding.body
    assert body.line_of("subjects") == 17
    assert body["subjects"].item_lines == [18, 19]
    assert body["subjects"][1].line_of("name") == 20
    assert body["empty"] is None
    assert body.line_of("empty") == 21
    assert body["numbers"] == [1, 31, 1.5, date(2026, 1, 1), None, True]
    assert body["quoted"] == "it's # not a comment"
    # What the line helpers fall back to.
    assert files.line_of(body, "nowhere") == 13
    assert files.line_of(body["subjects"], 7) == 18
    assert files.line_of("a scalar", "x") == 0
    assert binding.problem("m", body["subjects"], 1).line == 19
    assert binding.problem("m").line == 13


def test_shipped_policies_and_fixtures_read_as_pyyaml_reads_them() -> None:
    found = sorted(ROOT.glob("policies/**/*.yaml")) + sorted(ROOT.glob("tests/**/*.yaml"))
    assert len(found) > 20
    read = 0
    for path in found:
        text = path.read_text()
        docs, problems = parse_yaml_documents(text, str(path))
        try:
            expected = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError:
            assert problems, path  # a bad-policy fixture: a problem, never an exception
            continue
        if not problems:
            assert [plain(d.body) for d in docs] == expected, path
            read += 1
    assert read > 20


def test_merge_keys_anchors_aliases_and_block_text() -> None:
    docs, problems = parse_yaml_documents(
        "kind: X\nbase: &b {x: 1}\nm: {<<: *b, y: 2}\nc: *b\nd: |\n  block\n"
        "e: >\n  folded\nk: !!str 5\n? complex\n: value\n1: int key\nnull: 2\n",
        "f",
    )
    assert problems == []
    body = docs[0].body
    assert body["m"] == {"x": 1, "y": 2}
    assert body["c"] is body["base"]  # an alias is the anchored value itself
    assert (body["d"], body["e"], body["k"]) == ("block\n", "folded\n", "5")
    assert (body["complex"], body["1"], body["None"]) == ("value", "int key", 2)
    assert body.line_of("1") == 12


def test_duplicate_keys_and_bad_yaml_are_problems_with_lines() -> None:
    _, problems = parse_yaml_documents("kind: A\nmetadata: {}\nkind: B\n", "f.yaml")
    assert [str(p) for p in problems] == ["f.yaml:3: not valid YAML: duplicate key 'kind'"]
    _, problems = parse_yaml_documents("kind: A\nm: {a: 1, b: 2,\n  a: 3}\n", "f.yaml")
    assert [str(p) for p in problems] == ["f.yaml:3: not valid YAML: duplicate key 'a'"]
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


def test_empty_documents_and_files_hold_nothing() -> None:
    for text in ["", "# only a comment\n", "---\n", "---\n---\n", "kind: A\n---\n...\n"]:
        docs, problems = parse_yaml_documents(text, "f")
        assert problems == []
        assert [d.kind for d in docs] == (["A"] if "kind" in text else [])


@pytest.mark.parametrize(
    ("text", "line", "complaint"),
    [
        ("kind: A\nx: !!int s3cret\n", 2, "not a valid int value"),
        ("kind: A\nx: !!float s3cret\n", 2, "not a valid float value"),
        ("kind: A\nx: !!bool s3cret\n", 2, "not a valid bool value"),
        ("kind: A\n\nx: 2026-13-45\n", 3, "not a valid timestamp value"),
        ("kind: A\nx: &a [1, *a]\n", 2, "recursive"),
        ("kind: A\nx: !s3cret value\n", 2, "could not determine a constructor"),
        ("kind: A\nx: " + "[" * 2000 + "\n", 2, "nesting depth"),
        ("kind: A\nx:\n" + "".join(" " * i + "- \n" for i in range(990)), 1, "nested too"),
        ("kind: A\nsecret: s3cret\tvalue\n  bad: 1\n", 3, ""),
    ],
)
def test_malformed_values_are_problems_that_do_not_quote_the_file(
    text: str, line: int, complaint: str
) -> None:
    """A value the safe constructor cannot build is a problem at its line, never an
    exception; no problem quotes the file's text (a snippet may hold a secret)."""
    docs, problems = parse_yaml_documents(text, "f.yaml")
    assert docs == []
    assert len(problems) == 1, problems
    assert (problems[0].file, problems[0].line) == ("f.yaml", line)
    assert problems[0].message.startswith("not valid YAML: ")
    assert complaint in problems[0].message
    assert "s3cret value" not in problems[0].message
    assert "s3cret\t" not in problems[0].message
    assert "^" not in problems[0].message  # no snippet with its caret


def test_a_generated_policy_reads_as_pyyaml_reads_it() -> None:
    text, _ = generate(1_000, 10, random.Random(1))
    docs, problems = parse_yaml_documents(text, "p.yaml")
    assert problems == []
    assert [plain(d.body) for d in docs] == list(yaml.safe_load_all(text))
    # Each document starts where the text says it does.
    starts = [1] + [n + 2 for n, ln in enumerate(text.split("\n")) if ln == "---"]
    assert [d.line for d in docs] == starts


# Any text but lone surrogates and YAML's line breaks besides \n (NEL, LS, PS, CR: quoted,
# they are folded, so PyYAML would not read back what it dumped).
_chars = st.characters(exclude_categories=["Cs"], exclude_characters="\x85\u2028\u2029\r")
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(_chars, max_size=8),
    st.sampled_from(["yes", "no", "on", "~", "1e3", "0o17", "<<x", "*", "12:30", "2026-01-01"]),
)
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(_chars, min_size=1, max_size=6), inner, max_size=4),
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(_tree, min_size=1, max_size=3), flow=st.sampled_from([False, True, None]))
def test_random_documents_read_as_pyyaml_reads_them(docs: list[Any], flow: bool | None) -> None:
    """Values equal PyYAML's own safe loading; every remembered line is one the
    document spans, and block-style keys are on the line they are written on."""
    text = yaml.safe_dump_all(docs, default_flow_style=flow, allow_unicode=True)
    values = files._values(text)
    assert [plain(v) for v, _ in values] == list(yaml.safe_load_all(text))
    count = text.count("\n") + 1

    def check(value: Any) -> None:
        if isinstance(value, Node):
            assert 1 <= value.line <= count
            for key, item in value.items():
                assert value.line <= value.key_lines[key] <= count
                check(item)
        elif isinstance(value, NodeList):
            assert len(value.item_lines) == len(value)
            assert all(value.line <= n <= count for n in value.item_lines)
            for item in value:
                check(item)

    def block_keys_in_order(value: Any) -> None:
        if isinstance(value, Node):
            key_lines = list(value.key_lines.values())
            assert key_lines == sorted(set(key_lines))  # one key a line, in order
            for item in value.values():
                block_keys_in_order(item)
        elif isinstance(value, NodeList):
            for item in value:
                block_keys_in_order(item)

    for value, line in values:
        assert 1 <= line <= count
        check(value)
        if flow is False:
            block_keys_in_order(value)


def test_libyaml_is_used_and_the_pure_python_fallback_reads_the_same() -> None:
    """PyYAML without libyaml falls back to its SafeLoader: same values, same lines,
    same problems (for the shipped policies, the fixtures and a generated policy)."""
    assert yaml.__with_libyaml__
    assert issubclass(files._LineLoader, yaml.CSafeLoader)
    fallback = files.line_loader(yaml.SafeLoader)
    found = sorted(ROOT.glob("policies/**/*.yaml")) + sorted(ROOT.glob("tests/**/*.yaml"))
    texts = [SAMPLE, generate(300, 3, random.Random(2))[0]] + [p.read_text() for p in found]
    texts += ["kind: A\nmetadata: {}\nkind: B\n", "kind: A\nx: !!int s3cret\n"]
    for text in texts:
        try:
            fast = files._values(text)
        except yaml.YAMLError as exc:
            with pytest.raises(type(exc)):
                files._values(text, fallback)
            continue
        slow = files._values(text, fallback)
        assert [(plain(v), lines(v), n) for v, n in fast] == [
            (plain(v), lines(v), n) for v, n in slow
        ]


def test_the_collector_is_paused_during_a_load_and_restored_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failed load")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # the reloader's pause is left to the reloader
    finally:
        gc.enable()


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
    from sidecar.config.settings import load_config
    from sidecar.core.identity import Identity
    from sidecar.policy.source.bundle import load_bundle
    from sidecar.policy.tools.explain import explain

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

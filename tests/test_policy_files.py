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

ROOT = Path(__file__).resolve().parent.parent


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
    assert (
        len(problems) == 1
        and problems[0].file == "g.yaml"
        and "not valid YAML" in problems[0].message
    )
    _, problems = parse_yaml_documents("kind: A\nx: *nowhere\n", "h.yaml")
    assert len(problems) == 1 and "undefined alias" in problems[0].message
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

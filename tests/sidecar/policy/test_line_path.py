"""The line path of policy file reading (`files._values_from_lines`): whatever it
reads, it reads exactly as libyaml's event path does, values and lines alike, and
whatever it cannot vouch for (or libyaml refuses) it hands to the event path."""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.bench_policy import generate
from sidecar.policy import files
from sidecar.policy.files import collector_paused
from tests.rigs import paths
from tests.sidecar.policy.test_files import assert_same

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
  when: owner
  ownerField: spec.owner
---
kind: TenantRoleBinding
metadata:
  tenant: acme
  name: b0
roleRef: {kind: TenantRole, name: role0}
subjects:
  - {kind: User, name: alice}
  - kind: Group
    name: system:authenticated
  -   kind: ServiceAccount
      name: robot
      namespace: dev
empty:
numbers: [1, -2, 0x1f, 1.5, .inf, 12:30, 2026-01-01, ~, null, yes, no, on]
nested: [a, [b, {c: d}], {e: [f]}, []]
quoted: 'it''s # not a comment'
text: a b  c
"""


def read_both(text: str) -> bool:
    """Whether the line path read `text`; if it did, the event path must read it too
    and give the same documents, values and lines."""
    try:
        fast = files._values_from_lines(text)
    except files._Unsupported:
        return False
    slow = files._values_from_events(text)
    assert [line for _, line in fast] == [line for _, line in slow]
    for (a, _), (b, _) in zip(fast, slow, strict=True):
        assert_same(a, b)
    return True


def test_the_sample_and_a_generated_policy_are_read_by_the_line_path() -> None:
    assert read_both(SAMPLE)
    text, _ = generate(1_000, 10, random.Random(1))
    assert read_both(text)


def test_shipped_policies_and_fixtures_read_the_same_either_way() -> None:
    texts = [p.read_text() for p in sorted(ROOT.glob("policies/**/*.yaml"))]
    texts += [p.read_text() for p in sorted(ROOT.glob("tests/**/*.yaml"))]
    read = [read_both(t) for t in texts]
    assert sum(read) > 10  # most files are the common shape


@pytest.mark.parametrize(
    "text",
    [
        "---\n",
        "kind: A\n---\n",
        "---\n---\nkind: A\n",
        "kind: A\n...\n",
        "%YAML 1.1\n---\nkind: A\n",
        "- a\n- b\n",
        "just a scalar\n",
        "kind: A\nx: &a 1\ny: *a\n",
        "kind: A\nx: !!str 1\n",
        "kind: A\nx: |\n  block\n",
        "kind: A\nx: >\n  folded\n",
        "kind: A\nx: two\n  lines\n",
        "kind: A\nx: 'two\n  lines'\n",
        "kind: A\nx: [a,\n  b]\n",
        'kind: A\nx: "esc\\n"\n',
        "kind: A\n\tx: 1\n",
        "kind: A\r\nx: 1\r\n",
        "kind: A\nx: caf\u00e9\n",
        "kind: A\nx: \x07\n",
        "kind: A\nkind: B\n",
        "kind: A\nm: {a: 1, a: 2}\n",
        "kind: A\nm: {<<: {a: 1}}\n",
        "kind: A\n<<: {a: 1}\n",
        "kind: A\n? complex\n: value\n",
        "kind: A\nx: b: c\n",
        "kind: A\nx: a#b\n",
        "kind: A\nx: -\n",
        "kind: A\nx:\n- - a\n",
        "kind: A\nx:\n  - a\n b: 1\n",
        "kind: A\nx:\n    a: 1\n  b: 2\n",
        "kind: A\nx: [a, , b]\n",
        "kind: A\nx: [a: b]\n",
        "kind: A\nx: {a:b}\n",
        "kind: A\nx: {a: }\n",
        "kind: A\nx: [a]b\n",
        "kind: A\nx: 'a'b\n",
        "kind: A\nx: *\n",
        "kind: A\nx: *a\n",
        "kind: A\nx: [a, *a]\n",
        "kind: A\nx:\n- a\n  - b\n",
        "kind: A\nx:\n  - a\n    b\n",
        "kind: A\nx: [*]\n",
        "kind: A\nx: /api/*\n",
        "key:value\n",
        "kind: A\n  x: 1\n",
        "  kind: A\n",
        "kind: A\n- a\n",
        "kind: A\nx: 1\n- a\n",
        "---x\nkind: A\n",
        "--- # c\nkind: A\n",
        "--- {kind: A}\n",
    ],
)
def test_odd_yaml_is_left_to_the_event_path(text: str) -> None:
    assert not read_both(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only a comment\n",
        "kind: A\n",
        "---\nkind: A\n",
        "kind: A\n---\nkind: B\n",
        "kind: A  \nx:   1   # c\n#\n   # c\n\ny: 'q'  \n",
        "kind: A\nx:\n",
        "kind: A\nx:\ny: 1\n",
        "kind: A\nx:\n- a\n-   {b: c}\n- [d]\ny: 2\n",
        "kind: A\nx:\n  - a: 1\n    b:\n    - c\n  - d\n",
        "kind: A\nx:\n      deep: 1\ny: 2\n",
        "kind: A\nmy key: a  b\n'quoted key': 1\n\"dq\": 2\nk:b: 3\n",
        "kind: A\nx: [a b, 'c, d', \"e\", -f, g:h, '', \"\"]\n",
        "kind: A\nx: {a b: c d, 'e': 'f''g', h: [i, {j: k}]}\n",
        "kind: A\nx: [ ]\ny: { }\nz: []\n",
        "kind: A\nnull: 1\ntrue: 2\n3: 4\n",
        "kind: A\nx: ...\ny: a - b\n",
        "kind: A\nx: [a -, -b]\n",
        "kind: A\nkey :  v\n",
    ],
)
def test_simple_yaml_is_read_by_the_line_path_the_same_way(text: str) -> None:
    assert read_both(text)


@pytest.mark.parametrize("c", list("&*!|>'\"%@`?:-,[]{}#~.+=<;()$^/_\\"))
def test_every_indicator_anywhere_reads_the_same_way(c: str) -> None:
    for text in [
        f"kind: A\nx: {c}a 1\n",
        f"kind: A\nx: a{c}b\n",
        f"kind: A\nx: a {c}b\n",
        f"kind: A\nx: a{c} b\n",
        f"kind: A\nx: a{c}\n",
        f"kind: A\n{c}a: 1\n",
        f"kind: A\na{c}: 1\n",
        f"kind: A\nx: [{c}a, b]\n",
        f"kind: A\nx: [a{c}, b]\n",
        f"kind: A\nx: {{{c}a: b}}\n",
        f"kind: A\nx: {{a: b{c}}}\n",
        f"kind: A\nx:\n- {c}a\n",
        f"kind: A\nx:\n-{c} a\n",
    ]:
        try:
            read_both(text)
        except yaml.YAMLError as exc:
            raise AssertionError(f"line path accepted invalid YAML {text!r}: {exc}") from exc


# -- differential fuzzing against libyaml ----------------------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(alphabet="ab -_.:/*#'\",[]{}", max_size=6),
    st.sampled_from(["yes", "no", "~", "1e3", "0o17", "12:30", "2026-01-01", "-x", "a:b"]),
)
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(alphabet="abk_-.", min_size=1, max_size=5), inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    docs=st.lists(
        st.dictionaries(st.sampled_from(["kind", "a", "b c"]), _tree, min_size=1), min_size=1
    ),
    flow=st.sampled_from([False, None]),
    indent=st.sampled_from([2, 4]),
)
def test_dumped_documents_read_the_same_way(
    docs: list[dict[str, Any]], flow: bool | None, indent: int
) -> None:
    text = yaml.safe_dump_all(docs, default_flow_style=flow, width=10**6, indent=indent)
    read_both(text)


_EDITS = [*" -:#'\"[]{},\n\tab*&!|>?%@`~.0", "- ", ": ", "  ", "---\n", "\n  "]


@settings(max_examples=600, deadline=None)
@given(data=st.data())
def test_mutated_policies_are_read_the_same_way_or_left_to_libyaml(data: st.DataObject) -> None:
    """Random edits of a policy: whatever the line path still reads, libyaml reads
    identically (so it never accepts what libyaml refuses, nor reads it otherwise)."""
    text = SAMPLE
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(text)))
        action = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        edit = data.draw(st.sampled_from(_EDITS))
        if action == "insert":
            text = text[:pos] + edit + text[pos:]
        elif action == "delete":
            text = text[:pos] + text[pos + data.draw(st.integers(1, 3)) :]
        else:
            text = text[:pos] + edit + text[pos + 1 :]
    try:
        read_both(text)
    except yaml.YAMLError as exc:  # the line path read what libyaml refuses
        raise AssertionError(f"line path accepted invalid YAML {text!r}: {exc}") from exc


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab\n", max_size=40), chunk=st.integers(0, 8))
def test_lines_are_split_a_chunk_at_a_time_as_in_one_go(text: str, chunk: int) -> None:
    assert list(files._split_lines(text, chunk)) == text.split("\n")


# -- the paused collector --------------------------------------------------------------


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

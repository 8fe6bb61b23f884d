"""The streaming owner filter (sidecar/services/listfilter.py with the rule of
sidecar/policy/owner.py): the same answer whatever the chunk boundaries, equal to
filtering the whole document at once; truncated, invalid or oversized input is an
error, never a shorter list; nothing of an answer that is not a list comes out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backing_store.tables import table_version as store_table_version
from sidecar.core.status import StatusError
from sidecar.policy.owner import OwnerListFilter, list_filter, table_version
from sidecar.services.listfilter import EMPTY_LIST, BrokenList, ListStream

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
OWNERS = st.sampled_from(["acme", "beta", "", None, 7, ["acme"], {"x": "acme"}])
SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=12)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def run(
    flt: OwnerListFilter, doc: bytes, cuts: list[int] | None = None, max_part: int = 1 << 20
) -> bytes:
    """Feed `doc` split at `cuts` (sorted offsets); the whole output."""
    stream = ListStream(flt.item, flt.row, max_part)
    out = []
    start = 0
    for cut in [*(cuts or []), len(doc)]:
        out.append(stream.feed(doc[start:cut]))
        start = cut
    out.append(stream.finish())
    return b"".join(out)


@st.composite
def items(draw: st.DrawFn) -> dict[str, Any]:
    item: dict[str, Any] = {"metadata": {"name": draw(st.text(max_size=8))}}
    owner = draw(OWNERS)
    shape = draw(st.sampled_from(["spec", "no spec", "spec not a map"]))
    if shape == "spec":
        item["spec"] = {} if owner is None else {"owner": owner}
    elif shape == "spec not a map":
        item["spec"] = owner
    if draw(st.booleans()):
        item["extra"] = draw(VALUES)
    return item


@st.composite
def list_docs(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """A list document as ordered (key, value) pairs: `items` anywhere among the other
    top-level fields (Go writes it last, a sorted-keys writer in the middle)."""
    fields: list[tuple[str, Any]] = [
        ("kind", "NodeList"),
        ("apiVersion", "v1"),
        ("metadata", {"resourceVersion": "12", "continue": draw(st.text(max_size=6))}),
    ]
    if draw(st.booleans()):
        fields.append(("extra", draw(VALUES)))
    fields = draw(st.permutations(fields))
    position = draw(st.integers(0, len(fields)))
    fields.insert(position, ("items", draw(st.lists(items(), max_size=8))))
    return fields


def encode(fields: list[tuple[str, Any]], indent: int | None) -> bytes:
    inner = [f"{json.dumps(k)}:{json.dumps(v, indent=indent)}" for k, v in fields]
    return ("{" + (",\n" if indent else ",").join(inner) + "}").encode()


def expected(fields: list[tuple[str, Any]], tenant: str) -> list[tuple[str, Any]]:
    """Filtering the whole document at once."""
    return [
        (k, [i for i in v if isinstance(i.get("spec"), dict) and i["spec"].get("owner") == tenant])
        if k == "items"
        else (k, v)
        for k, v in fields
    ]


def pairs(raw: bytes) -> Any:
    return json.loads(raw, object_pairs_hook=list)


def as_pairs(value: Any) -> Any:
    """A value as `json.loads(..., object_pairs_hook=list)` reads it back."""
    return pairs(json.dumps(value).encode())


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(doc=list_docs(), indent=st.sampled_from([None, 1]), data=st.data())
def test_any_chunking_gives_the_whole_document_filtered(
    doc: list[tuple[str, Any]], indent: int | None, data: st.DataObject
) -> None:
    raw = encode(doc, indent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12), label="cuts"))
    out = run(list_filter("acme", "spec.owner"), raw, cuts)
    assert pairs(out) == as_pairs_fields(expected(doc, "acme"))
    assert out == run(list_filter("acme", "spec.owner"), raw)  # one piece or many


def as_pairs_fields(fields: list[tuple[str, Any]]) -> Any:
    return [(k, as_pairs(v)) for k, v in fields]


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(doc=list_docs(), data=st.data())
def test_a_truncated_document_is_an_error(doc: list[tuple[str, Any]], data: st.DataObject) -> None:
    raw = encode(doc, None)
    end = data.draw(st.integers(0, len(raw) - 1), label="end")
    cuts = sorted(data.draw(st.lists(st.integers(0, end), max_size=6), label="cuts"))
    with pytest.raises(BrokenList):
        run(list_filter("acme", "spec.owner"), raw[:end], cuts)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"items":[{"spec":{"owner":"acme"}}]} {"items":[]}',  # two documents
        b'{"items":[{"spec":{"owner":"acme"}}]}x',
        b'{"items":[{"spec":{"owner":"acme"},}]}',
        b'{"items":[{"spec":{"owner":"ac\xffme"}}]}',  # not UTF-8
        b'{"items":[{"spec":{"owner":"acme"}}],"items":[{"spec":{"owner":"acme"}}]}',
        b'{"items":[NaN]}',
        b'{"metadata":{"n":1e400},"items":[]}',  # no double holds it
        b"",
    ],
)
def test_invalid_documents_are_errors(raw: bytes) -> None:
    with pytest.raises(BrokenList):
        run(list_filter("acme", "spec.owner"), raw, list(range(1, len(raw), 5)))


def test_a_part_larger_than_the_bound_is_an_error_even_when_dropped() -> None:
    big = {"spec": {"owner": "beta"}, "pad": "x" * 200_000}
    raw = json.dumps({"items": [{"spec": {"owner": "acme"}}, big]}).encode()
    with pytest.raises(BrokenList, match="larger than"):
        run(list_filter("acme", "spec.owner"), raw, list(range(0, len(raw), 4096)), 100_000)
    # The same items within the bound pass, one at a time.
    assert pairs(run(list_filter("acme", "spec.owner"), raw, None, 300_000)) == [
        ("items", [[("spec", [("owner", "acme")])]])
    ]
    header = json.dumps({"metadata": {"pad": "y" * 200_000}, "items": []}).encode()
    with pytest.raises(BrokenList, match="larger than"):
        run(list_filter("acme", "spec.owner"), header, list(range(0, len(header), 4096)), 100_000)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"kind":"Node","metadata":{"name":"n2"},"spec":{"owner":"beta"}}',  # one object
        b'{"kind":"NodeList","metadata":{"resourceVersion":"1"}}',  # no items at all
        b'[{"spec":{"owner":"acme"}},{"spec":{"owner":"beta"}}]',
        b'"items"',
        b"17",
    ],
)
def test_an_answer_that_is_not_a_list_becomes_an_empty_list(raw: bytes) -> None:
    assert run(list_filter("acme", "spec.owner"), raw, [3, 9]) == EMPTY_LIST


def test_items_that_are_not_an_array_are_no_list() -> None:
    """`items: null` (or an object) holds no elements and does not make an answer a
    list: a single object carrying one still shows none of its fields."""
    for raw in (
        b'{"kind":"Node","spec":{"owner":"beta"},"items":null}',
        b'{"items":{"a":{"spec":{"owner":"beta"}}},"kind":"NodeList"}',
    ):
        assert run(list_filter("acme", "spec.owner"), raw, [5]) == EMPTY_LIST
    # Beside a real array it is written as an empty one.
    raw = b'{"kind":"Table","items":null,"rows":[],"metadata":{}}'
    assert json.loads(run(list_filter("acme", "spec.owner"), raw, [9])) == {
        "kind": "Table",
        "items": [],
        "rows": [],
        "metadata": {},
    }


def test_numbers_and_strings_keep_their_value() -> None:
    item = {"spec": {"owner": "acme"}, "n": 2**70, "f": 0.1, "neg": -1.5e-7, "s": 'é\u2028"\\'}
    raw = json.dumps({"items": [item]}, ensure_ascii=False).encode()
    assert json.loads(run(list_filter("acme", "spec.owner"), raw, [7, 30])) == {"items": [item]}


def test_another_owner_field() -> None:
    raw = json.dumps(
        {"items": [{"status": {"tenant": "acme"}}, {"spec": {"owner": "acme"}}]}
    ).encode()
    assert json.loads(run(list_filter("acme", "status.tenant"), raw)) == {
        "items": [{"status": {"tenant": "acme"}}]
    }


# -- Tables ---------------------------------------------------------------------------


def table(objects: list[dict[str, Any]], version: str = "v1") -> bytes:
    return json.dumps(
        {
            "kind": "Table",
            "apiVersion": f"meta.k8s.io/{version}",
            "metadata": {"resourceVersion": "9", "continue": "c"},
            "columnDefinitions": [{"name": "Name", "type": "string"}],
            "rows": [{"cells": [o["metadata"]["name"]], "object": o} for o in objects],
        }
    ).encode()


NODES = [
    {"kind": "Node", "metadata": {"name": "n1", "labels": {"a": "b"}}, "spec": {"owner": "acme"}},
    {"kind": "Node", "metadata": {"name": "n2"}, "spec": {"owner": "beta"}},
    {"kind": "Node", "metadata": {"name": "n3"}, "spec": {}},
]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_table_rows_carry_partial_object_metadata_by_default(version: str) -> None:
    accept = f"application/json;as=Table;v={version};g=meta.k8s.io, application/json"
    flt = list_filter("acme", "spec.owner", accept, None)
    assert flt.upstream_query == [("owner", "acme"), ("includeObject", "Object")]
    doc = json.loads(run(flt, table(NODES, version), [11, 200]))
    assert doc["kind"] == "Table"
    assert doc["metadata"] == {"resourceVersion": "9", "continue": "c"}
    assert doc["columnDefinitions"] == [{"name": "Name", "type": "string"}]
    assert doc["rows"] == [
        {
            "cells": ["n1"],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": f"meta.k8s.io/{version}",
                "metadata": {"name": "n1", "labels": {"a": "b"}},
            },
        }
    ]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    objects=st.lists(items(), max_size=6),
    include=st.sampled_from(["Metadata", "Object", "None"]),
    data=st.data(),
)
def test_any_chunking_of_a_table_gives_its_rows_filtered(
    objects: list[dict[str, Any]], include: str, data: st.DataObject
) -> None:
    raw = table(objects)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=10), label="cuts"))
    flt = list_filter("acme", "spec.owner", TABLE_ACCEPT, include)
    rows = json.loads(run(flt, raw, cuts))["rows"]
    mine = [
        o for o in objects if isinstance(o.get("spec"), dict) and o["spec"].get("owner") == "acme"
    ]
    assert [r["cells"] for r in rows] == [[o["metadata"]["name"]] for o in mine]

    def shown(o: dict[str, Any]) -> dict[str, Any]:
        if include == "Object":
            return {"object": o}
        if include == "None":
            return {}
        meta = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}
        return {"object": {**meta, "metadata": o["metadata"]}}

    assert rows == [{"cells": [o["metadata"]["name"]], **shown(o)} for o in mine]


def test_table_rows_as_the_client_asked() -> None:
    whole = list_filter("acme", "spec.owner", TABLE_ACCEPT, "Object")
    assert json.loads(run(whole, table(NODES)))["rows"] == [{"cells": ["n1"], "object": NODES[0]}]
    bare = list_filter("acme", "spec.owner", TABLE_ACCEPT, "None")
    assert json.loads(run(bare, table(NODES)))["rows"] == [{"cells": ["n1"]}]
    assert list_filter("acme", "spec.owner", TABLE_ACCEPT, "").include == "Metadata"
    with pytest.raises(StatusError) as refused:
        list_filter("acme", "spec.owner", TABLE_ACCEPT, "Everything")
    assert refused.value.code == 400
    # Not a Table: includeObject is the upstream's business, and is left alone.
    plain = list_filter("acme", "spec.owner", "application/json", "Everything")
    assert plain.upstream_query == [("owner", "acme")]


def test_rows_without_their_object_are_dropped() -> None:
    """An upstream that ignored `includeObject=Object`: no owner to read, no row."""
    partial = [{"kind": "PartialObjectMetadata", "metadata": n["metadata"]} for n in NODES]
    flt = list_filter("acme", "spec.owner", TABLE_ACCEPT, None)
    assert json.loads(run(flt, table(partial)))["rows"] == []
    raw = b'{"kind":"Table","rows":[{"cells":["n1"]},7,null,{"object":"x"}]}'
    assert json.loads(run(flt, raw))["rows"] == []


def test_a_plain_list_answered_to_a_table_request_is_filtered_too() -> None:
    flt = list_filter("acme", "spec.owner", TABLE_ACCEPT, None)
    raw = json.dumps({"kind": "NodeList", "items": NODES}).encode()
    assert json.loads(run(flt, raw)) == {"kind": "NodeList", "items": [NODES[0]]}


ACCEPT_PARTS = st.sampled_from(
    [
        "application/json",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
        "application/json;as=Table;v=v2;g=meta.k8s.io",
        "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
        "application/json; as=Table; g=meta.k8s.io; v=v1",
        "application/*;as=Table;v=v1;g=meta.k8s.io",
        "*/*",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
        "APPLICATION/JSON;as=Table;v=v1;g=meta.k8s.io",
        "application/json;as",
        "",
    ]
)


@given(st.lists(ACCEPT_PARTS, max_size=4))
def test_the_sidecar_reads_accept_as_the_store_does(parts: list[str]) -> None:
    accept = ",".join(parts)
    request = make_mocked_request("GET", "/api/v1/nodes", headers={"Accept": accept})
    assert table_version(accept) == store_table_version(request)

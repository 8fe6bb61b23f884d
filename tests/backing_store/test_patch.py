"""JSON patch (through the `jsonpatch` library) and JSON merge patch
(backing_store/patch.py): which errors are a malformed patch (400) and which a patch
that does not apply (422), as Kubernetes tells them apart. The patch types over HTTP
are in test_bodies.py (JSON, merge) and test_strategic.py (strategic merge)."""

from __future__ import annotations

from typing import Any

import pytest

from backing_store.errors import StatusError
from backing_store.patch import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    apply_patch,
    json_patch,
)

DOC: dict[str, Any] = {"metadata": {"name": "c"}, "data": {"a": "1"}, "list": [1, 2], "s": "x"}


@pytest.mark.parametrize(
    ("ops", "code"),
    [
        ({"op": "add"}, 400),  # not a list
        ([5], 400),  # an operation that is not an object
        ([{"op": "frobnicate", "path": "/a"}], 400),
        ([{"op": ["add"], "path": "/a"}], 400),
        ([{"op": "add", "value": 1}], 400),  # no path
        ([{"op": "add", "path": 5, "value": 1}], 400),
        ([{"op": "add", "path": "data", "value": 1}], 400),  # not a JSON pointer
        ([{"op": "add", "path": "/data/~2", "value": 1}], 400),  # a bad escape
        ([{"op": "add", "path": "/data/b"}], 400),  # no value
        ([{"op": "move", "path": "/x"}], 400),  # no from
        ([{"op": "replace", "path": "/list/-", "value": 3}], 400),
        ([{"op": "test", "path": "/data/a", "value": "2"}], 422),
        ([{"op": "remove", "path": "/data/nope"}], 422),
        ([{"op": "add", "path": "/list/9", "value": 1}], 422),
        ([{"op": "add", "path": "/list/01", "value": 1}], 422),
        ([{"op": "add", "path": "/s/x", "value": 1}], 422),  # into a string
        ([{"op": "move", "from": "/data", "path": "/data/b"}], 422),  # into itself
        ([{"op": "copy", "from": "/nope", "path": "/x"}], 422),
        ([{"op": "remove", "path": ""}], 422),
    ],
)
def test_json_patch_errors(ops: Any, code: int) -> None:
    with pytest.raises(StatusError) as err:
        json_patch(DOC, ops)
    assert err.value.code == code
    assert DOC["data"] == {"a": "1"}  # never changed in place


def test_json_patch_applies_to_a_copy() -> None:
    ops = [
        {"op": "test", "path": "/data/a", "value": "1"},
        {"op": "add", "path": "/list/-", "value": 3},
        {"op": "copy", "from": "/data/a", "path": "/data/~1b~0"},
        {"op": "move", "from": "/s", "path": "/t"},
    ]
    got = json_patch(DOC, ops)
    assert got["list"] == [1, 2, 3]
    assert got["data"] == {"a": "1", "/b~": "1"}
    assert (got.get("s"), got["t"]) == (None, "x")
    assert DOC["list"] == [1, 2]


@pytest.mark.parametrize(
    ("ctype", "patch", "want"),
    [
        # RFC 7386: lists are replaced, null deletes, the original stays as it was
        (
            MERGE_PATCH,
            {"list": [9], "data": {"a": None, "b": "2"}},
            {"list": [9], "data": {"b": "2"}},
        ),
        ("application/json", {"list": [9]}, {"list": [9]}),
        (STRATEGIC_MERGE_PATCH, {"list": [9], "data": {"a": None}}, {"list": [9], "data": {}}),
        (JSON_PATCH, [{"op": "remove", "path": "/list/0"}], {"list": [2]}),
    ],
)
def test_patch_types(ctype: str, patch: Any, want: dict[str, Any]) -> None:
    got = apply_patch(ctype, DOC, patch, "ConfigMap")
    assert {k: got.get(k) for k in want} == want
    assert DOC == {"metadata": {"name": "c"}, "data": {"a": "1"}, "list": [1, 2], "s": "x"}


@pytest.mark.parametrize("ctype", [MERGE_PATCH, STRATEGIC_MERGE_PATCH])
def test_a_merge_patch_is_an_object(ctype: str) -> None:
    with pytest.raises(StatusError) as err:
        apply_patch(ctype, DOC, [1], "ConfigMap")
    assert err.value.code == 400

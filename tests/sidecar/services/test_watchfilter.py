"""The owner filter of a watch's events (sidecar/services/watchfilter.py): what a caller
whose only grant is an owner rule sees of each event, plain JSON and Table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.policy.owner import list_filter
from sidecar.services.watchfilter import BrokenWatch, WatchFilter

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def node(name: str, owner: str, **labels: str) -> dict[str, Any]:
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7", "labels": labels},
        "spec": {"owner": owner, "secret": "of " + owner},
    }


def line(kind: str, obj: Any) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def events(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.splitlines()]


def plain() -> WatchFilter:
    return WatchFilter(list_filter("acme", "spec.owner"), 1 << 20)


def test_only_owned_objects_events_go_out() -> None:
    flt = plain()
    out = flt.feed(
        line("ADDED", node("n1", "acme"))
        + line("ADDED", node("n2", "beta"))
        + line("MODIFIED", node("n2", "beta"))
        + line("MODIFIED", node("n1", "acme", a="b"))
    )
    got = events(out)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
        ("ADDED", "n1"),
        ("MODIFIED", "n1"),
    ]
    assert got[1]["object"] == node("n1", "acme", a="b")


def test_an_owner_changed_away_is_a_deleted_event_that_shows_nothing_of_it() -> None:
    out = plain().feed(line("DELETED", node("n1", "beta", team="b")))
    (event,) = events(out)
    assert event == {
        "type": "DELETED",
        "object": {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": "n1", "uid": "uid-n1", "resourceVersion": "7"},
        },
    }
    assert b"beta" not in out


def test_events_split_across_chunks_and_the_last_without_a_newline() -> None:
    flt = plain()
    data = line("ADDED", node("n1", "acme")) + line("ADDED", node("n3", "acme")).rstrip(b"\n")
    out = b"".join(flt.feed(data[i : i + 7]) for i in range(0, len(data), 7))
    assert [e["object"]["metadata"]["name"] for e in events(out)] == ["n1"]
    assert [e["object"]["metadata"]["name"] for e in events(flt.finish())] == ["n3"]


def test_bookmarks_and_errors_pass() -> None:
    bookmark = node("n2", "beta")  # a bookmark carries a resourceVersion, nothing else
    error = {"kind": "Status", "code": 410, "reason": "Expired"}
    out = plain().feed(line("BOOKMARK", bookmark) + line("ERROR", error))
    assert events(out) == [
        {
            "type": "BOOKMARK",
            "object": {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}},
        },
        {"type": "ERROR", "object": error},
    ]


@pytest.mark.parametrize(
    "bad",
    [b"not json\n", b"[1]\n", b'{"object": {}}\n', json.dumps(node("n2", "beta")).encode()],
)
def test_a_line_that_is_no_event_is_dropped(bad: bytes) -> None:
    flt = plain()
    assert flt.feed(bad) + flt.finish() == b""
    # and the stream goes on
    assert events(flt.feed(line("ADDED", node("n1", "acme"))))[0]["type"] == "ADDED"


def test_a_line_longer_than_the_limit_breaks_the_watch() -> None:
    flt = WatchFilter(list_filter("acme", "spec.owner"), 100)
    with pytest.raises(BrokenWatch):
        flt.feed(b'{"type":"ADDED","object":' + b" " * 200)


def table_event(kind: str, obj: dict[str, Any]) -> bytes:
    columns = [{"name": "Name"}, {"name": "Owner"}, {"name": "Age"}]
    row = {"cells": [obj["metadata"]["name"], obj["spec"]["owner"], "1s"], "object": obj}
    table = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "columnDefinitions": columns}
    return line(kind, {**table, "rows": [row]})


def test_table_rows_carry_what_the_client_asked_for() -> None:
    flt = WatchFilter(list_filter("acme", "spec.owner", TABLE), 1 << 20)
    out = flt.feed(
        table_event("ADDED", node("n1", "acme")) + table_event("ADDED", node("n2", "beta"))
    )
    (event,) = events(out)
    (row,) = event["object"]["rows"]
    assert row["cells"] == ["n1", "acme", "1s"]
    assert row["object"]["kind"] == "PartialObjectMetadata"  # the default, Metadata
    assert "spec" not in row["object"]


def test_a_table_row_that_left_shows_its_name_only() -> None:
    flt = WatchFilter(list_filter("acme", "spec.owner", TABLE, "Object"), 1 << 20)
    out = flt.feed(table_event("DELETED", node("n1", "beta")))
    (event,) = events(out)
    (row,) = event["object"]["rows"]
    assert row["cells"] == ["n1", "", ""]
    assert row["object"]["metadata"] == {"name": "n1", "uid": "uid-n1", "resourceVersion": "7"}
    assert b"beta" not in out

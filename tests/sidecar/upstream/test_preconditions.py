"""The body rewriting of sidecar/upstream/preconditions.py (issue 28): a write held to
the state it was decided on, for every body type; the client's own precondition kept
or the object read again; every body it cannot read a 4xx."""

from __future__ import annotations

import json

import pytest

from sidecar.core.status import StatusError
from sidecar.upstream.preconditions import (
    DecidedState,
    StateChanged,
    held_delete_options,
    parse_write_body,
)

RV = DecidedState("42", "u-1")
CREATED = DecidedState("", "u-2")


def held(method: str, ctype: str, raw: bytes, state: DecidedState | None = RV) -> object:
    return json.loads(parse_write_body(method, ctype, "", raw).with_state(state))


def test_a_json_patch_gets_a_leading_test_of_the_version() -> None:
    ops = [{"op": "copy", "from": "/status/x", "path": "/spec/x"}]
    got = held("PATCH", "application/json-patch+json", json.dumps(ops).encode())
    assert got == [{"op": "test", "path": "/metadata/resourceVersion", "value": "42"}, *ops]


@pytest.mark.parametrize(
    ("method", "ctype"),
    [
        ("PUT", "application/json"),
        ("PATCH", "application/merge-patch+json"),
        ("PATCH", "application/strategic-merge-patch+json"),
        ("PATCH", "application/json"),
        ("PATCH", "application/apply-patch+yaml"),
    ],
)
def test_an_object_body_gets_the_version_in_its_metadata(method: str, ctype: str) -> None:
    got = held(method, ctype, b'{"metadata": {"name": "p"}, "spec": {"x": 1}}')
    assert got == {"metadata": {"name": "p", "resourceVersion": "42"}, "spec": {"x": 1}}


def test_an_apply_in_yaml_is_sent_as_the_json_it_reads_as() -> None:
    raw = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec: {when: 2024-01-01, n: 1.5}\n"
    body = parse_write_body("PATCH", "application/apply-patch+yaml", "", raw)
    assert json.loads(body.plain()) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"when": "2024-01-01", "n": 1.5},
    }
    # an apply that creates: held by the dry run's uid, no version
    assert json.loads(body.with_state(CREATED))["metadata"] == {"name": "p", "uid": "u-2"}


def test_duplicate_keys_are_sent_as_read() -> None:
    """One reading: the sidecar's (the last of a duplicated key), for both requests."""
    raw = b'{"spec": {"cpu": "1000"}, "spec": {"cpu": "1"}}'
    body = parse_write_body("PATCH", "application/merge-patch+json", "", raw)
    assert json.loads(body.plain()) == {"spec": {"cpu": "1"}}


def test_the_clients_own_precondition_must_be_the_decided_one() -> None:
    same = b'{"metadata": {"resourceVersion": "42"}}'
    assert held("PATCH", "application/merge-patch+json", same) == json.loads(same)
    other = b'{"metadata": {"resourceVersion": "41"}}'
    with pytest.raises(StateChanged):
        held("PATCH", "application/merge-patch+json", other)
    # a JSON patch keeps the client's own tests after the sidecar's
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "41"}]
    got = held("PATCH", "application/json-patch+json", json.dumps(ops).encode())
    assert isinstance(got, list)
    assert got[1:] == ops


def test_delete_options_get_preconditions() -> None:
    assert json.loads(held_delete_options(b"", RV)) == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"resourceVersion": "42", "uid": "u-1"},
    }
    given = b'{"propagationPolicy": "Background", "preconditions": {"uid": "u-1"}}'
    assert json.loads(held_delete_options(given, RV)) == {
        "propagationPolicy": "Background",
        "preconditions": {"uid": "u-1", "resourceVersion": "42"},
    }
    with pytest.raises(StateChanged):
        held_delete_options(b'{"preconditions": {"uid": "u-9"}}', RV)
    for bad in (b"[1]", b'{"preconditions": 1}', b"{"):
        with pytest.raises(StatusError) as caught:
            held_delete_options(bad, RV)
        assert caught.value.code == 400


@pytest.mark.parametrize(
    ("method", "ctype", "encoding", "raw", "code"),
    [
        ("PATCH", "application/merge-patch+json", "gzip", b"{}", 415),
        ("PATCH", "text/plain", "", b"{}", 415),
        ("PUT", "application/json-patch+json", "", b"[]", 415),
        ("PATCH", "application/merge-patch+json", "", b"", 400),
        ("PATCH", "application/merge-patch+json", "", b"[]", 400),
        ("PATCH", "application/json-patch+json", "", b"{}", 400),
        ("PATCH", "application/merge-patch+json", "", b'{"metadata": []}', 400),
        ("PATCH", "application/merge-patch+json", "", b'{"x": 1e400}', 400),
        ("PATCH", "application/merge-patch+json", "", b'{"a":' * 150 + b"1" + b"}" * 150, 400),
        ("PATCH", "application/apply-patch+yaml", "", b"x: .nan\n", 400),
        ("PATCH", "application/apply-patch+yaml", "", b"x: !!set {a}\n", 400),
        ("PATCH", "application/apply-patch+yaml", "", b"- 1\n", 400),
    ],
)
def test_unreadable_bodies_are_4xx(
    method: str, ctype: str, encoding: str, raw: bytes, code: int
) -> None:
    with pytest.raises(StatusError) as caught:
        parse_write_body(method, ctype, encoding, raw)
    assert caught.value.code == code


def test_the_state_of_an_object() -> None:
    assert DecidedState.of({"metadata": {"resourceVersion": "7", "uid": "u"}}) == (
        DecidedState("7", "u")
    )
    assert DecidedState.of({"metadata": {}}) is None
    assert DecidedState.of(None) is None
    assert DecidedState.of({"metadata": {"resourceVersion": 7}}) is None

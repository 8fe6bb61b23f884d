"""The API policy follower's bookkeeping, without I/O (sidecar/services/apipolicy.py):
watch events older than the list are dropped, a list replaces what was known of its
kind, objects without a valid identity are skipped and counted, and a watch that says
something it cannot mean (an unknown event type, an error, not JSON) is broken, so the
kind is listed again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.policy.source.store import PolicyStore
from sidecar.services.apipolicy import ApiPolicyFollower, Unreadable

POLICY = """\
kind: ClusterRole
metadata: {name: r}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
"""


@pytest.fixture
def follower(tmp_path: Path) -> ApiPolicyFollower:
    (tmp_path / "p.yaml").write_text(POLICY)
    store = PolicyStore([tmp_path])
    return ApiPolicyFollower("http://127.0.0.1:1", store, lambda bundle: None)


def rb(name: str, tenant: str, rv: int, ns: str = "dev") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "tenant": tenant, "namespace": ns, "resourceVersion": str(rv)},
        "roleRef": {"kind": "ClusterRole", "name": "r"},
        "subjects": [{"kind": "User", "name": "bob"}],
    }


def event(kind: str, obj: Any) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def test_events_older_than_the_list_are_dropped(follower: ApiPolicyFollower) -> None:
    follower._replace("RoleBinding", [rb("a", "acme", 5)])
    follower._event("RoleBinding", event("DELETED", rb("a", "acme", 4)), 5)
    assert ("RoleBinding", "acme", "dev", "a") in follower.objects
    follower._event("RoleBinding", event("DELETED", rb("a", "acme", 6)), 5)
    assert follower.objects == {}
    follower._event("RoleBinding", event("ADDED", rb("b", "beta", 7)), 5)
    assert list(follower.by_tenant) == ["beta"]


def test_a_list_replaces_its_kind_only(follower: ApiPolicyFollower) -> None:
    follower._replace("RoleBinding", [rb("a", "acme", 1), rb("b", "acme", 2)])
    follower._replace("Role", [{"metadata": {"name": "x", "tenant": "acme", "namespace": "dev"}}])
    follower._replace("RoleBinding", [rb("b", "acme", 2)])
    assert sorted(k[3] for k in follower.objects) == ["b", "x"]


@pytest.mark.parametrize(
    "meta",
    [
        {"name": "a", "tenant": "ACME", "namespace": "dev"},
        {"name": "a/b", "tenant": "acme", "namespace": "dev"},
        {"name": "a", "tenant": "acme"},
        {"name": "a:b", "tenant": "acme", "namespace": "dev"},
        {"tenant": "acme", "namespace": "dev"},
    ],
)
def test_an_object_without_a_valid_identity_is_skipped(
    follower: ApiPolicyFollower, meta: dict[str, Any]
) -> None:
    follower._event("RoleBinding", event("ADDED", {**rb("a", "acme", 9), "metadata": meta}), 0)
    assert follower.objects == {}
    assert len(follower.broken_identity) == 1


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1]",
        event("ERROR", {"kind": "Status"}),
        event("SURPRISE", rb("a", "acme", 9)),
        json.dumps({"type": "ADDED", "object": "x"}).encode(),
    ],
)
def test_a_watch_saying_what_it_cannot_mean_is_broken(
    follower: ApiPolicyFollower, line: bytes
) -> None:
    with pytest.raises(Unreadable):
        follower._event("RoleBinding", line, 0)
    assert follower.objects == {}

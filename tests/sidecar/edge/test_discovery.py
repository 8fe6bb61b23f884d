"""The discovery documents of the groups the sidecar serves (DESIGN §10): answered by
the sidecar, and added to the upstream's `/apis` (both discovery formats)."""

from __future__ import annotations

import json

from sidecar.edge.discovery import SERVED, api_group, resource_list, with_served_groups


def test_group_and_resource_list_documents() -> None:
    doc = api_group("authorization.k8s.io")
    assert doc["preferredVersion"] == {"groupVersion": "authorization.k8s.io/v1", "version": "v1"}
    kinds = {r["kind"]: r for r in resource_list("authorization.k8s.io")["resources"]}
    assert set(kinds) == {
        "SelfSubjectAccessReview",
        "SelfSubjectRulesReview",
        "SubjectAccessReview",
    }
    assert all(r["verbs"] == ["create"] and r["namespaced"] is False for r in kinds.values())


def test_groups_added_to_an_api_group_list_once() -> None:
    upstream = {
        "kind": "APIGroupList",
        "groups": [{"name": "apps"}, api_group("authentication.k8s.io")],
    }
    out = json.loads(with_served_groups(200, json.dumps(upstream).encode()))
    names = [g["name"] for g in out["groups"]]
    assert names == ["apps", "authentication.k8s.io", "authorization.k8s.io"]
    again = json.loads(with_served_groups(200, json.dumps(out).encode()))
    assert again == out


def test_groups_added_to_an_aggregated_discovery_list() -> None:
    upstream = {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "items": [],
    }
    out = json.loads(with_served_groups(200, json.dumps(upstream).encode()))
    assert {i["metadata"]["name"] for i in out["items"]} == set(SERVED)
    resources = out["items"][0]["versions"][0]["resources"]
    assert all(r["scope"] == "Cluster" and r["verbs"] == ["create"] for r in resources)


def test_other_answers_pass_unchanged() -> None:
    for status, body in (
        (200, b"not json"),
        (200, b"[]"),
        (500, b'{"kind":"APIGroupList","groups":[]}'),
        (200, b'{"kind":"Status"}'),
    ):
        assert with_served_groups(status, body) == body

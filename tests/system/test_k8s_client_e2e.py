"""The official Python `kubernetes` client against the real sidecar (HTTPS) and the real
store (issue 14): the same kubeconfigs as kubectl's tests (the test CA, static tokens),
CoreV1Api list/create/delete of config maps with selectors and dry runs, a watch,
access reviews (AuthorizationV1Api), whoami (AuthenticationV1Api), and isolation: another
tenant's objects stay 404 and never show in lists.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.rigs.cluster import NS, ClusterEnv

if importlib.util.find_spec("kubernetes") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("the kubernetes client is not installed (the `dev` extra)")
    pytest.skip("the kubernetes client is not installed (the `dev` extra)", allow_module_level=True)

from kubernetes import client, config, watch


@pytest.fixture(scope="module")
def api(cluster: ClusterEnv) -> Iterator[dict[str, Any]]:
    """One ApiClient per user, each from that user's kubeconfig."""
    clients = {
        # kubernetes' config and watch modules are unannotated (its models are typed)
        user: config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
        for user, path in cluster.kubeconfigs.items()
    }
    yield clients
    for c in clients.values():
        c.close()


def configmap(name: str, labels: dict[str, str] | None = None) -> Any:
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels=labels), data={"k": "v"}
    )


def names(items: Any) -> set[str]:
    return {item.metadata.name for item in items.items}


def test_list_create_select_delete(api: dict[str, Any], cluster: ClusterEnv) -> None:
    core = client.CoreV1Api(api["alice"])
    core.create_namespaced_config_map(NS, configmap("py-web", {"tier": "front"}))
    core.create_namespaced_config_map(NS, configmap("py-db", {"tier": "back"}))
    try:
        assert {"py-web", "py-db"} <= names(core.list_namespaced_config_map(NS))
        assert names(core.list_namespaced_config_map(NS, label_selector="tier=front")) == {"py-web"}
        assert names(core.list_namespaced_config_map(NS, field_selector="metadata.name=py-db")) == {
            "py-db"
        }
        read = core.read_namespaced_config_map("py-web", NS)
        assert read.data == {"k": "v"}
        assert cluster.used("acme", "configmaps") == "2"
    finally:
        core.delete_namespaced_config_map("py-web", NS)
        core.delete_namespaced_config_map("py-db", NS)
    assert not {"py-web", "py-db"} & names(core.list_namespaced_config_map(NS))
    assert cluster.used("acme", "configmaps") == "0"


def test_dry_run_create_and_delete(api: dict[str, Any], cluster: ClusterEnv) -> None:
    core = client.CoreV1Api(api["alice"])
    created = core.create_namespaced_config_map(NS, configmap("py-dry"), dry_run="All")
    assert created.metadata is not None
    assert created.metadata.name == "py-dry"
    assert "py-dry" not in names(core.list_namespaced_config_map(NS))
    core.create_namespaced_config_map(NS, configmap("py-kept"))
    try:
        core.delete_namespaced_config_map(
            "py-kept", NS, body=client.V1DeleteOptions(dry_run=["All"])
        )
        assert "py-kept" in names(core.list_namespaced_config_map(NS))
        assert cluster.used("acme", "configmaps") == "1"
    finally:
        core.delete_namespaced_config_map("py-kept", NS)


def test_watch_sees_a_create(api: dict[str, Any]) -> None:
    core = client.CoreV1Api(api["alice"])
    seen: list[str] = []
    done = threading.Event()

    def follow() -> None:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            stream = w.stream(core.list_namespaced_config_map, NS, timeout_seconds=20)  # type: ignore[no-untyped-call]
            for event in stream:
                seen.append(f"{event['type']} {event['object'].metadata.name}")
                if any(s.startswith("ADDED py-watched") for s in seen):
                    w.stop()  # type: ignore[no-untyped-call]
        finally:
            done.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    created: list[str] = []
    try:
        # Creates until one shows up: the watch only sends events after it started.
        for i in range(20):
            name = f"py-watched-{i}"
            core.create_namespaced_config_map(NS, configmap(name))
            created.append(name)
            if done.wait(1.0):
                break
        assert any(s.startswith("ADDED py-watched") for s in seen), seen
    finally:
        for name in created:
            core.delete_namespaced_config_map(name, NS)


def access_review(api_client: Any, verb: str, resource: str, namespace: str | None) -> Any:
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, namespace=namespace
            )
        )
    )
    return client.AuthorizationV1Api(api_client).create_self_subject_access_review(review)


def test_self_subject_access_review(api: dict[str, Any]) -> None:
    assert access_review(api["alice"], "create", "configmaps", NS).status.allowed is True
    assert access_review(api["vera"], "delete", "configmaps", NS).status.allowed is False
    assert access_review(api["vera"], "list", "configmaps", NS).status.allowed is True
    assert access_review(api["alice"], "create", "nodes", None).status.allowed is False


def test_dynamic_client_finds_and_creates_a_self_subject_access_review(
    api: dict[str, Any],
) -> None:
    """The dynamic client discovers before it calls: it must find the review kinds the
    sidecar serves (DESIGN §10)."""
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api["alice"])
    ssar = dyn.resources.get(api_version="authorization.k8s.io/v1", kind="SelfSubjectAccessReview")
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "list", "resource": "configmaps", "namespace": NS}},
    }
    answer = ssar.create(body=body)
    assert answer.status.allowed is True
    body["spec"]["resourceAttributes"]["resource"] = "nodes"
    body["spec"]["resourceAttributes"].pop("namespace")
    assert ssar.create(body=body).status.allowed is False


def test_self_subject_rules_review(api: dict[str, Any]) -> None:
    review = client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace=NS))
    answer = client.AuthorizationV1Api(api["vera"]).create_self_subject_rules_review(review)
    assert answer.status is not None
    rules = answer.status.resource_rules
    assert any("configmaps" in (r.resources or []) and "list" in r.verbs for r in rules), rules
    assert not any(
        "configmaps" in (r.resources or []) and ("delete" in r.verbs or "*" in r.verbs)
        for r in rules
    ), rules


def test_whoami(api: dict[str, Any]) -> None:
    answer = client.AuthenticationV1Api(api["bob"]).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    assert answer.status is not None
    assert answer.status.user_info is not None
    assert answer.status.user_info.username == "bob"


def test_isolation(api: dict[str, Any], cluster: ClusterEnv) -> None:
    alice = client.CoreV1Api(api["alice"])
    bob = client.CoreV1Api(api["bob"])
    alice.create_namespaced_config_map(NS, configmap("py-private"))
    try:
        # bob's short paths are his own tenant's ns1.
        assert "py-private" not in names(bob.list_namespaced_config_map(NS))
        with pytest.raises(client.ApiException) as caught:
            bob.read_namespaced_config_map("py-private", NS)
        assert caught.value.status == 404
        # acme's tenant path: concealed, the 404 of a tenant that does not exist.
        status, body = cluster.call(
            "bob", "GET", f"/api/v1/tenants/acme/namespaces/{NS}/configmaps/py-private"
        )
        assert status == 404, body
        assert body["details"]["kind"] == "tenants", body
        # Lists across tenants are concealed too.
        with pytest.raises(client.ApiException) as caught:
            bob.list_config_map_for_all_namespaces()
        assert caught.value.status in (403, 404)
        with pytest.raises(client.ApiException) as caught:
            bob.delete_namespaced_config_map("py-private", NS)
        assert caught.value.status == 404
        assert "py-private" in names(alice.list_namespaced_config_map(NS))
    finally:
        alice.delete_namespaced_config_map("py-private", NS)

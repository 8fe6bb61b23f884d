"""The official Python `kubernetes` client against the real sidecar (HTTPS) and the real
store (issue 14): the same kubeconfigs as kubectl's tests (the test CA, static tokens),
CoreV1Api list/create/delete of config maps with selectors and dry runs, a watch,
access reviews (AuthorizationV1Api), whoami (AuthenticationV1Api), and isolation: another
tenant's objects stay 404 and never show in lists (a tenant user's "all namespaces" list
is its own tenant's), DELETE's `V1Status`, and server-side tables (issue 23).
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

    dyn = DynamicClient(api["alice"])  # type: ignore[no-untyped-call]
    ssar = dyn.resources.get(api_version="authorization.k8s.io/v1", kind="SelfSubjectAccessReview")
    body: dict[str, Any] = {
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
        # "All namespaces" is every namespace of the caller's own tenant (DESIGN §3).
        bob.create_namespaced_config_map(NS, configmap("py-beta"))
        try:
            assert "py-beta" in names(bob.list_config_map_for_all_namespaces())
            assert "py-private" not in names(bob.list_config_map_for_all_namespaces())
            assert "py-beta" not in names(alice.list_config_map_for_all_namespaces())
            assert "py-private" in names(alice.list_config_map_for_all_namespaces())
        finally:
            bob.delete_namespaced_config_map("py-beta", NS)
        with pytest.raises(client.ApiException) as caught:
            bob.delete_namespaced_config_map("py-private", NS)
        assert caught.value.status == 404
        assert "py-private" in names(alice.list_namespaced_config_map(NS))
    finally:
        alice.delete_namespaced_config_map("py-private", NS)


def test_delete_answers_a_status(api: dict[str, Any], cluster: ClusterEnv) -> None:
    """An immediate DELETE answers a `Status` of success (DESIGN §10), which the client
    reads as a `V1Status` naming the object and its uid; the charge is returned."""
    core = client.CoreV1Api(api["alice"])
    created = core.create_namespaced_config_map(NS, configmap("py-doomed"))
    before = int(cluster.used("acme", "configmaps"))
    # The client returns the answer as it came (a dict): a DELETE may answer the object
    # (graceful deletion, finalizers) or a Status. Here it is a Status.
    raw = core.delete_namespaced_config_map("py-doomed", NS)
    assert isinstance(raw, dict)
    assert (raw["kind"], raw["apiVersion"]) == ("Status", "v1"), raw
    answer = client.V1Status.from_dict(raw)
    assert answer is not None
    assert answer.status == "Success"
    assert answer.details is not None
    assert (answer.details.name, answer.details.kind, answer.details.uid) == (
        "py-doomed",
        "configmaps",
        created.metadata.uid if created.metadata else None,
    )
    assert int(cluster.used("acme", "configmaps")) == before - 1
    with pytest.raises(client.ApiException) as caught:
        core.delete_namespaced_config_map("py-doomed", NS)
    assert caught.value.status == 404


TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def table(api_client: Any, path: str) -> dict[str, Any]:
    """A server-side `Table` (kubectl get's request), read with the dynamic client."""
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api_client)  # type: ignore[no-untyped-call]
    answer = dyn.request("GET", path, header_params={"Accept": TABLE})
    body: dict[str, Any] = answer.to_dict()
    assert (body["kind"], body["apiVersion"]) == ("Table", "meta.k8s.io/v1"), body
    return body


def test_tables_for_a_client(api: dict[str, Any], cluster: ClusterEnv) -> None:
    """What `kubectl get` prints, asked for by a client: a config map's Data column, and
    the node owner's table of only acme's nodes (owner-filtered, still a Table)."""
    core = client.CoreV1Api(api["alice"])
    core.create_namespaced_config_map(NS, configmap("py-table"))
    made = {"py-n-acme": "acme", "py-n-beta": "beta"}
    for name, owner in made.items():
        node = {"metadata": {"name": name}, "spec": {"owner": owner, "resource_class": "gpu"}}
        status, body = cluster.call("admin", "POST", "/api/v1/nodes", node)
        assert status == 201, body
    try:
        answer = table(api["alice"], f"/api/v1/namespaces/{NS}/configmaps")
        columns = [c["name"] for c in answer["columnDefinitions"]]
        assert columns == ["Name", "Data", "Age"], answer
        cells = {row["cells"][0]: row["cells"] for row in answer["rows"]}
        assert cells["py-table"][1] == 1, answer
        answer = table(api["nora"], "/api/v1/nodes")
        columns = [c["name"] for c in answer["columnDefinitions"]]
        assert columns == ["Name", "Owner", "Resource Class", "Age"], answer
        owners = {row["cells"][0]: row["cells"][1] for row in answer["rows"]}
        assert owners == {"py-n-acme": "acme"}, answer
    finally:
        core.delete_namespaced_config_map("py-table", NS)
        for name in made:
            cluster.call("admin", "DELETE", f"/api/v1/nodes/{name}")

"""Everyday kubectl (1.32) against a real store process (issue 23, DESIGN §10
"Kubernetes fidelity for everyday kubectl"): `describe` of a configmap, a node, a
namespace and a deployment (the field selectors it sends for events and pods),
`apply --server-side` twice and a forced conflict, `set image` and `patch` (strategic,
merge, JSON) on a two-container Deployment, `get`'s column headers, `delete`.

The `kubectl` fixture (tests/backing_store/conftest.py) runs the store with
`--assume-tenant system`; these tests skip without kubectl, and fail under CI=true."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.rigs.kube import Kubectl

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: app
        image: app:1
        env: [{name: A, value: "1"}]
      - name: side
        image: side:1
"""


def write(kubectl: Kubectl, name: str, doc: Any) -> str:
    path: Path = kubectl.tmp / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def create(kubectl: Kubectl, doc: dict[str, Any]) -> None:
    kubectl.run(
        "create", "-f", write(kubectl, f"{doc['kind']}-{doc['metadata']['name']}.json", doc)
    )


def event(name: str, involved: dict[str, str], reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Normal",
        "source": {"component": "tests"},
        "count": 1,
    }


def containers(kubectl: Kubectl) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = kubectl.get("deployment", "web")["spec"]["template"]["spec"][
        "containers"
    ]
    return got


def test_describe_configmap_shows_its_events(kubectl: Kubectl) -> None:
    create(
        kubectl,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"}, "data": {"a": "1"}},
    )
    uid = kubectl.get("configmap", "web")["metadata"]["uid"]
    involved = {"kind": "ConfigMap", "namespace": "default", "name": "web", "uid": uid}
    create(kubectl, event("web.1", involved, "Checked", "mine"))
    # an event about another object of the same name (another uid) is not shown
    create(kubectl, event("web.2", {**involved, "uid": "other"}, "Stale", "not mine"))
    out = kubectl.run("describe", "configmap", "web").stdout
    assert "Name:         web" in out
    assert "Checked" in out
    assert "mine" in out
    assert "Stale" not in out


def test_describe_node_lists_its_running_pods(kubectl: Kubectl) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "spec": {"owner": "acme"},
    }
    create(kubectl, node)
    for name, node_name, phase in (
        ("run", "n1", "Running"),
        ("done", "n1", "Succeeded"),
        ("away", "n2", "Running"),
    ):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": phase},
        }
        create(kubectl, pod)
    uid = kubectl.get("node", "n1")["metadata"]["uid"]
    create(
        kubectl, event("n1.1", {"kind": "Node", "name": "n1", "uid": uid}, "Rebooted", "up again")
    )
    out = kubectl.run("describe", "node", "n1").stdout
    assert "Non-terminated Pods:          (1 in total)" in out
    pods = out.split("Non-terminated Pods:", 1)[1].split("Allocated resources:", 1)[0]
    assert " run " in pods
    assert " done " not in pods
    assert " away " not in pods
    assert "Rebooted" in out


def test_describe_namespace_and_deployment(kubectl: Kubectl) -> None:
    out = kubectl.run("describe", "namespace", "default").stdout
    assert "Name:         default" in out
    assert "No resource quota." in out
    kubectl.run("apply", "--server-side", "-f", write(kubectl, "web.yaml", DEPLOYMENT))
    out = kubectl.run("describe", "deployment", "web").stdout
    assert "Selector:           app=web" in out
    assert "Image:      app:1" in out
    assert "Image:         side:1" in out


def test_apply_server_side_twice_then_a_forced_conflict(kubectl: Kubectl) -> None:
    manifest = write(kubectl, "web.yaml", DEPLOYMENT)
    first = kubectl.run("apply", "--server-side", "-f", manifest)
    assert first.stdout.strip() == "deployment.apps/web serverside-applied"
    before = kubectl.get("deployment", "web", "--show-managed-fields")
    second = kubectl.run("apply", "--server-side", "-f", manifest)
    assert second.stdout.strip() == "deployment.apps/web serverside-applied"
    # nothing changed, nothing stored
    assert kubectl.get("deployment", "web", "--show-managed-fields") == before
    [entry] = before["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("kubectl", "Apply")

    # another manager applying another replica count conflicts with kubectl
    other = write(kubectl, "other.yaml", DEPLOYMENT.replace("replicas: 2", "replicas: 5"))
    refused = kubectl.run("apply", "--server-side", "--field-manager=ops", "-f", other, check=False)
    assert refused.returncode != 0
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .spec.replicas' in refused.stderr
    assert kubectl.get("deployment", "web")["spec"]["replicas"] == 2
    kubectl.run("apply", "--server-side", "--field-manager=ops", "--force-conflicts", "-f", other)
    after = kubectl.get("deployment", "web", "--show-managed-fields")
    assert after["spec"]["replicas"] == 5
    owned = {e["manager"]: e["fieldsV1"]["f:spec"] for e in after["metadata"]["managedFields"]}
    assert "f:replicas" in owned["ops"]
    assert "f:replicas" not in owned["kubectl"]


def test_set_image_and_patches_keep_the_other_container(kubectl: Kubectl) -> None:
    kubectl.run("apply", "--server-side", "-f", write(kubectl, "web.yaml", DEPLOYMENT))
    kubectl.run("set", "image", "deployment/web", "app=app:2")
    assert containers(kubectl) == [
        {"name": "app", "image": "app:2", "env": [{"name": "A", "value": "1"}]},
        {"name": "side", "image": "side:1"},
    ]
    stored = json.dumps(kubectl.get("deployment", "web"))
    assert "$setElementOrder" not in stored
    assert "$patch" not in stored
    # kubectl patch: strategic (the default) merges containers by name
    kubectl.run(
        "patch",
        "deployment",
        "web",
        "-p",
        '{"spec":{"template":{"spec":{"containers":[{"name":"side","image":"side:2"}]}}}}',
    )
    assert [(c["name"], c["image"]) for c in containers(kubectl)] == [
        ("app", "app:2"),
        ("side", "side:2"),
    ]
    # merge: a list is replaced whole, as RFC 7386 says
    kubectl.run("patch", "deployment", "web", "--type=merge", "-p", '{"spec":{"replicas":3}}')
    kubectl.run(
        "patch",
        "deployment",
        "web",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/template/spec/containers/1/image","value":"side:3"}]',
    )
    got = kubectl.get("deployment", "web")
    assert got["spec"]["replicas"] == 3
    assert [c["image"] for c in got["spec"]["template"]["spec"]["containers"]] == [
        "app:2",
        "side:3",
    ]
    # the image kubectl-set changed is its own now: applying the manifest conflicts
    refused = kubectl.run(
        "apply", "--server-side", "-f", write(kubectl, "web.yaml", DEPLOYMENT), check=False
    )
    assert refused.returncode != 0
    assert 'conflicts with "kubectl-set" using apps/v1' in refused.stderr
    assert '- .spec.template.spec.containers[name="app"].image' in refused.stderr


def test_get_prints_the_stores_columns(kubectl: Kubectl) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "spec": {"owner": "acme", "resource_class": "gpu"},
    }
    create(kubectl, node)
    server = {
        "apiVersion": "compute/v1",
        "kind": "Server",
        "metadata": {"name": "web1"},
        "tags": ["prod", "web"],
    }
    create(kubectl, server)
    nodes = kubectl.run("get", "nodes").stdout.splitlines()
    assert nodes[0].split() == ["NAME", "OWNER", "RESOURCE", "CLASS", "AGE"]
    assert nodes[1].split()[:3] == ["n1", "acme", "gpu"]
    servers = kubectl.run("get", "servers").stdout.splitlines()
    assert servers[0].split() == ["NAME", "TAGS", "STATUS", "AGE"]
    assert servers[1].split()[:3] == ["web1", "prod,web", "<none>"]
    wide = kubectl.run("get", "servers", "-A").stdout.splitlines()
    # Across every tenant: which tenant a row is from comes first (DESIGN §3).
    assert wide[0].split() == ["NAMESPACE", "TENANT", "NAME", "TAGS", "STATUS", "AGE"]


def test_delete_answers_a_status_kubectl_reads(kubectl: Kubectl) -> None:
    create(kubectl, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gone"}})
    out = kubectl.run("delete", "configmap", "gone").stdout
    assert out.strip() == 'configmap "gone" deleted'
    assert kubectl.names("configmaps") == []

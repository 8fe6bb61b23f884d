"""The real `kubectl` against the real sidecar (HTTPS) and the real store (issue 14).

The sidecar serves TLS with a certificate from a CA made here (`cryptography`), runs the
shipped `policies/`, and every user has a kubeconfig with that CA and a static token.
What a new user would try: discovery, get/create/label/delete with label selectors,
`create configmap` (a protobuf body), `--dry-run=server`, a watch, `auth can-i` (yes,
no, `--list`), `auth whoami`, and isolation as before: another tenant's objects stay
404 and never show in lists. A kubeconfig with the wrong CA fails the TLS handshake;
an unknown token is 401.

Everyday kubectl (issue 23, the table in docs/kubectl.md): `describe` of a configmap,
a namespace, a node (as the operator, with the pods on it, and as its owner `nora`)
and a deployment; `get`'s column headers for servers and nodes (the owner's list
filtered, still a table); `apply --server-side` twice, a conflict and
`--force-conflicts`; `diff` (client- and server-side); `set image` and every patch type
on a two-container Deployment under acme's cpu quota, the charge always what the store
keeps; DELETE's `Status`; and the commands the store does not serve, each failing with
the message the docs quote.

The tests skip only where kubectl is absent, never under `CI=true`. The cluster (the
`cluster` fixture of tests/system/conftest.py, tests/rigs/cluster.py) is shared with the
Python client's tests (tests/system/test_k8s_client_e2e.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.rigs.cluster import NS, USERS, ClusterEnv, kubeconfig, make_ca

# -- kubectl ------------------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: str
    err: str


class Kubectl:
    def __init__(self, binary: str, env: ClusterEnv) -> None:
        self.binary = binary
        self.env = env
        home = env.tmp / "home"
        home.mkdir(exist_ok=True)
        self.environ = {**os.environ, "HOME": str(home), "KUBECACHEDIR": str(home / "cache")}
        self.environ.pop("KUBECONFIG", None)

    def run(self, user: str, *args: str, kubeconfig: Path | None = None, stdin: str = "") -> Result:
        config = kubeconfig or self.env.kubeconfigs[user]
        proc = subprocess.run(
            [self.binary, "--kubeconfig", str(config), "--request-timeout=20s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=90,
            env=self.environ,
            check=False,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def ok(self, user: str, *args: str, stdin: str = "") -> str:
        result = self.run(user, *args, stdin=stdin)
        assert result.code == 0, f"kubectl {' '.join(args)} as {user}: {result.err}{result.out}"
        return result.out

    def names(self, user: str, *args: str) -> set[str]:
        return set(self.ok(user, "get", *args, "-o", "name").split())


@pytest.fixture(scope="module")
def kubectl(cluster: ClusterEnv, kubectl_binary: str) -> Kubectl:
    return Kubectl(kubectl_binary, cluster)


def test_discovery_lists_resources_with_short_names(kubectl: Kubectl) -> None:
    out = kubectl.ok("alice", "api-resources", "--no-headers")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert "configmaps" in rows, out
    assert "cm" in rows["configmaps"], out
    assert "servers" in rows, out
    assert kubectl.names("alice", "cm") == set()  # a short name works, and ns1 is empty


def test_discovery_of_the_groups_the_sidecar_serves(kubectl: Kubectl) -> None:
    """DESIGN §10: authorization.k8s.io and authentication.k8s.io are the sidecar's own
    groups; their discovery is answered by it and added to the upstream's /apis."""
    out = kubectl.ok("alice", "api-resources", "--api-group=authorization.k8s.io", "--no-headers")
    rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "subjectaccessreviews"} <= rows
    out = kubectl.ok("alice", "api-resources", "--api-group=authentication.k8s.io", "--no-headers")
    assert "selfsubjectreviews" in out, out


def test_create_configmap_label_select_and_delete(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    # `create configmap` sends a Kubernetes protobuf body.
    kubectl.ok("alice", "create", "configmap", "web", "--from-literal=a=b")
    kubectl.ok("alice", "create", "configmap", "db", "--from-literal=c=d")
    obj = json.loads(kubectl.ok("alice", "get", "configmap", "web", "-o", "json"))
    assert obj["data"] == {"a": "b"}
    kubectl.ok("alice", "label", "configmap", "web", "tier=front")
    kubectl.ok("alice", "label", "configmap", "db", "tier=back")
    assert kubectl.names("alice", "cm", "-l", "tier=front") == {"configmap/web"}
    assert kubectl.names("alice", "cm", "-l", "tier in (front,back)") == {
        "configmap/web",
        "configmap/db",
    }
    assert kubectl.names("alice", "cm", "-l", "tier!=front") == {"configmap/db"}
    assert kubectl.names("alice", "cm", "--field-selector", "metadata.name=db") == {"configmap/db"}
    # Quota: both charged in acme.
    assert cluster.used("acme", "configmaps") == "2"
    kubectl.ok("alice", "delete", "configmap", "-l", "tier=front")
    assert kubectl.names("alice", "cm") == {"configmap/db"}
    kubectl.ok("alice", "delete", "configmap", "db")
    assert kubectl.names("alice", "cm") == set()
    assert cluster.used("acme", "configmaps") == "0"


def test_dry_run_server_stores_and_charges_nothing(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    kubectl.ok("alice", "create", "configmap", "dry", "--from-literal=a=b", "--dry-run=server")
    manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dry2"}})
    kubectl.ok("alice", "create", "-f", "-", "--dry-run=server", stdin=manifest)
    assert kubectl.names("alice", "cm") == set()
    kubectl.ok("alice", "create", "configmap", "kept")
    kubectl.ok("alice", "delete", "configmap", "kept", "--dry-run=server")
    assert kubectl.names("alice", "cm") == {"configmap/kept"}
    assert cluster.used("acme", "configmaps") == "1"
    kubectl.ok("alice", "delete", "configmap", "kept")


def test_watch_sees_a_create(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    config = cluster.kubeconfigs["alice"]
    watch = subprocess.Popen(
        [kubectl.binary, "--kubeconfig", str(config), "get", "cm", "--watch-only", "-o", "name"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kubectl.environ,
    )
    created: list[str] = []
    try:
        assert watch.stdout is not None
        # Creates until one shows up in the watch: the first may land before the watch
        # is open, since only events after the watch started are sent.
        deadline = time.monotonic() + 30
        seen = ""
        while "configmap/watched-" not in seen:
            assert time.monotonic() < deadline, f"no event within 30s: {seen!r}"
            name = f"watched-{len(created)}"
            kubectl.ok("alice", "create", "configmap", name)
            created.append(name)
            seen += _readline(watch, 2.0)
    finally:
        watch.terminate()
        watch.wait(10)
        for name in created:
            kubectl.run("alice", "delete", "configmap", name)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """One line of the process's stdout, or '' after `timeout` seconds."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(timeout):
            return proc.stdout.readline()
    return ""


def can_i(kubectl: Kubectl, user: str, *args: str) -> tuple[int, str]:
    """(exit code, the answer's first word): kubectl prints `no - <reason>` when the
    review carries a reason."""
    result = kubectl.run(user, "auth", "can-i", *args)
    words = result.out.split()
    return result.code, words[0] if words else result.err


def test_auth_can_i_yes_and_no(kubectl: Kubectl) -> None:
    assert can_i(kubectl, "alice", "create", "configmaps") == (0, "yes")
    assert can_i(kubectl, "vera", "delete", "configmaps") == (1, "no")
    assert can_i(kubectl, "vera", "list", "configmaps") == (0, "yes")
    assert can_i(kubectl, "bob", "get", "configmaps", "-n", NS) == (0, "yes")  # his own ns1
    # Nodes are cluster-scoped: a tenant admin's POST /api/v1/nodes is refused, so the
    # review says no, although kubectl sends the context's namespace with it.
    assert can_i(kubectl, "alice", "create", "nodes") == (1, "no")


def test_auth_can_i_list(kubectl: Kubectl) -> None:
    out = kubectl.ok("vera", "auth", "can-i", "--list")
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    configmaps = [row for row in rows if row[0] == "configmaps"]
    assert configmaps, out
    verbs = " ".join(configmaps[0][1:])
    assert "get" in verbs, out
    assert "list" in verbs, out
    assert "delete" not in verbs, out


def test_auth_whoami(kubectl: Kubectl) -> None:
    who = json.loads(kubectl.ok("alice", "auth", "whoami", "-o", "json"))
    info = who["status"]["userInfo"]
    assert info["username"] == "alice"
    assert "tenant-admins" in info.get("groups", [])


def test_isolation_other_tenants_objects_stay_invisible(kubectl: Kubectl) -> None:
    kubectl.ok("alice", "create", "configmap", "secret-plans", "--from-literal=x=y")
    try:
        # bob's ns1 is beta's ns1: alice's configmap is not there.
        missing = kubectl.run("bob", "get", "configmap", "secret-plans")
        assert missing.code != 0, missing
        assert "NotFound" in missing.err, missing
        assert "configmap/secret-plans" not in kubectl.names("bob", "cm")
        # Naming acme's tenant path: the same 404 a tenant that does not exist gets.
        raw = kubectl.run(
            "bob", "get", "--raw", f"/api/v1/tenants/acme/namespaces/{NS}/configmaps/secret-plans"
        )
        assert raw.code != 0, raw
        assert "NotFound" in raw.err, raw
        listed = kubectl.run(
            "bob", "get", "--raw", f"/api/v1/tenants/acme/namespaces/{NS}/configmaps"
        )
        assert listed.code != 0, listed
        assert "secret-plans" not in listed.out, listed
        # All namespaces (a list across tenants): never shows acme's objects.
        everywhere = kubectl.run("bob", "get", "configmaps", "-A", "-o", "name")
        assert "secret-plans" not in everywhere.out, everywhere
        # Deleting it from beta's side touches nothing.
        gone = kubectl.run("bob", "delete", "configmap", "secret-plans")
        assert gone.code != 0, gone
        assert "configmap/secret-plans" in kubectl.names("alice", "cm")
    finally:
        kubectl.run("alice", "delete", "configmap", "secret-plans")


def test_get_all_namespaces_means_the_callers_tenant(kubectl: Kubectl) -> None:
    """DESIGN §3: a tenant user's `kubectl get -A` (a cluster-level list) lists every
    namespace of its own tenant, never another tenant's; `auth can-i … -A` agrees;
    a `system` caller keeps the all-tenants meaning."""
    kubectl.ok("alice", "create", "configmap", "acme-wide", "--from-literal=x=y")
    kubectl.ok("bob", "create", "configmap", "beta-wide", "--from-literal=x=y")
    try:
        alice = kubectl.run("alice", "get", "configmaps", "-A", "-o", "name")
        assert alice.code == 0, alice
        assert "configmap/acme-wide" in alice.out, alice
        assert "beta-wide" not in alice.out, alice
        bob = kubectl.run("bob", "get", "configmaps", "-A", "-o", "name")
        assert bob.code == 0, bob
        assert "configmap/beta-wide" in bob.out, bob
        assert "acme-wide" not in bob.out, bob
        assert can_i(kubectl, "alice", "list", "configmaps", "-A")[0] == 0
        # Both ways: a node owner may list no configmaps, and the review says so.
        refused = kubectl.run("nora", "get", "configmaps", "-A")
        assert refused.code != 0, refused
        assert "configmaps" in refused.err, refused
        assert can_i(kubectl, "nora", "list", "configmaps", "-A") == (1, "no")
        assert can_i(kubectl, "vera", "list", "configmaps", "-A") == (0, "yes")
        assert can_i(kubectl, "vera", "delete", "configmaps", "-A") == (1, "no")
        admin = kubectl.ok("admin", "get", "configmaps", "-A", "-o", "name")
        assert "configmap/acme-wide" in admin, admin
        assert "configmap/beta-wide" in admin, admin
    finally:
        kubectl.run("alice", "delete", "configmap", "acme-wide")
        kubectl.run("bob", "delete", "configmap", "beta-wide")


def test_wrong_ca_fails_the_handshake(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    other_file = cluster.tmp / "other-ca.crt"
    other_file.write_bytes(make_ca("another CA").cert_pem)
    config = cluster.tmp / "wrong-ca.kubeconfig"
    config.write_text(kubeconfig(cluster.url, other_file, "alice", USERS["alice"][0], NS))
    result = kubectl.run("alice", "get", "cm", kubeconfig=config)
    assert result.code != 0
    assert "certificate" in result.err, result.err
    assert "unknown authority" in result.err, result.err


def test_unknown_token_is_401(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    config = cluster.tmp / "bad-token.kubeconfig"
    config.write_text(kubeconfig(cluster.url, cluster.ca_file, "alice", "no-such-token", NS))
    result = kubectl.run(
        "alice", "get", "--raw", f"/api/v1/namespaces/{NS}/configmaps", kubeconfig=config
    )
    assert result.code != 0
    # kubectl's words for a 401.
    assert "must be logged in" in result.err, result.err


# -- impersonation (DESIGN §4) --------------------------------------------------------------

AS_VERA = ("--as=vera", "--as-group=viewers")


def test_impersonation_gives_exactly_the_impersonated_users_answers(kubectl: Kubectl) -> None:
    """alice (acme's tenant admin) with `--as=vera --as-group=viewers` gets what vera's
    own kubeconfig gets: reads yes, writes no, and `auth can-i` / `auth whoami` say so."""
    kubectl.ok("alice", "create", "configmap", "seen-by-vera")
    try:
        assert kubectl.names("alice", "cm", *AS_VERA) == kubectl.names("vera", "cm")
        assert "configmap/seen-by-vera" in kubectl.names("alice", "cm", *AS_VERA)
        for verb in ("list", "delete", "create"):
            assert can_i(kubectl, "alice", verb, "configmaps", *AS_VERA) == can_i(
                kubectl, "vera", verb, "configmaps"
            ), verb
        assert can_i(kubectl, "alice", "delete", "configmaps", *AS_VERA) == (1, "no")
        assert can_i(kubectl, "alice", "delete", "configmaps") == (0, "yes")
        refused = kubectl.run("alice", "delete", "configmap", "seen-by-vera", *AS_VERA)
        assert refused.code != 0, refused
        assert "Forbidden" in refused.err, refused.err
        assert 'User "vera" of tenant "acme"' in refused.err, refused.err
        assert "configmap/seen-by-vera" in kubectl.names("alice", "cm")
        who = json.loads(kubectl.ok("alice", "auth", "whoami", "-o", "json", *AS_VERA))
        info = who["status"]["userInfo"]
        assert info["username"] == "vera"
        assert "viewers" in info["groups"]
        assert "tenant-admins" not in info["groups"]
        assert info["extra"]["tenant"] == ["acme"]
    finally:
        kubectl.run("alice", "delete", "configmap", "seen-by-vera")


def test_a_reader_cannot_impersonate(kubectl: Kubectl) -> None:
    result = kubectl.run("vera", "get", "cm", "--as=admin")
    assert result.code != 0, result
    assert 'users "admin" is forbidden: User "vera" of tenant "acme" cannot impersonate' in (
        result.err
    ), result.err
    assert can_i(kubectl, "vera", "get", "configmaps", "--as=admin")[0] != 0


def impersonating_kubeconfig(
    cluster: ClusterEnv, user: str, name: str, as_user: str, groups: list[str], tenant: str
) -> Path:
    """`user`'s kubeconfig acting as `as_user` of `tenant` (kubeconfig `as`, `as-groups`,
    `as-user-extra`: kubectl has no flag for an extra)."""
    token = USERS[user][0]
    config = yaml.safe_load(kubeconfig(cluster.url, cluster.ca_file, user, token, NS))
    config["users"][0]["user"].update(
        {"as": as_user, "as-groups": groups, "as-user-extra": {"tenant": [tenant]}}
    )
    path = cluster.tmp / name
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_cluster_admin_acts_as_a_tenant_user(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    """A kubeconfig with `as-user-extra: {tenant: [acme]}`: the admin is alice of acme,
    and a short namespace path is acme's ns1, not the default tenant's."""
    config = impersonating_kubeconfig(
        cluster, "admin", "admin-as-alice.kubeconfig", "alice", ["tenant-admins"], "acme"
    )
    made = kubectl.run("admin", "create", "configmap", "made-by-admin-as-alice", kubeconfig=config)
    assert made.code == 0, made.err
    try:
        assert "configmap/made-by-admin-as-alice" in kubectl.names("alice", "cm")
        who = kubectl.run("admin", "auth", "whoami", "-o", "json", kubeconfig=config)
        assert json.loads(who.out)["status"]["userInfo"]["username"] == "alice", who.err
    finally:
        kubectl.run("alice", "delete", "configmap", "made-by-admin-as-alice")


def test_a_tenant_admin_cannot_act_as_a_user_of_another_tenant(
    kubectl: Kubectl, cluster: ClusterEnv
) -> None:
    config = impersonating_kubeconfig(
        cluster, "bob", "bob-as-alice.kubeconfig", "alice", ["tenant-admins"], "acme"
    )
    result = kubectl.run("bob", "get", "cm", kubeconfig=config)
    assert result.code != 0, result
    assert 'users "alice" is forbidden: User "bob" of tenant "beta"' in result.err, result.err


# -- everyday kubectl (issue 23): describe, server-side apply, diff, patches, tables -------

NODES = {"gpu-a1": ("acme", "gpu"), "cpu-a2": ("acme", "cpu"), "gpu-b1": ("beta", "gpu")}


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[dict[str, tuple[str, str]]]:
    """Bare-metal nodes made by the operator: two of acme's, one of beta's."""
    for name, (owner, resource_class) in NODES.items():
        spec = {"owner": owner, "resource_class": resource_class}
        status, body = cluster.call(
            "admin", "POST", "/api/v1/nodes", {"metadata": {"name": name}, "spec": spec}
        )
        assert status == 201, body
    yield NODES
    for name in NODES:
        cluster.call("admin", "DELETE", f"/api/v1/nodes/{name}")


def described(out: str) -> dict[str, str]:
    """The top-level `Key:  value` lines of a `kubectl describe`."""
    fields: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key.startswith(" "):
            fields.setdefault(key, value.strip())
    return fields


def header(out: str) -> list[str]:
    """The column names of a `kubectl get` table (two spaces or more between them)."""
    return re.split(r"\s{2,}", out.splitlines()[0].strip())


def rows(out: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells
        for line in out.splitlines()[1:]
        if line.strip()
        for cells in [re.split(r"\s{2,}", line.strip())]
    }


def millicores(quantity: str) -> int:
    """A cpu quantity ("500m", "2", "0.5") in millicores; the tests' own reading."""
    if quantity.endswith("m"):
        return int(quantity[:-1])
    return int(float(quantity) * 1000)


def cpu_of(deployment: dict[str, Any]) -> int:
    """What the stored deployment asks for: replicas x its containers' cpu requests."""
    spec = deployment["spec"]
    containers = spec["template"]["spec"]["containers"]
    per_pod = sum(
        millicores(c.get("resources", {}).get("requests", {}).get("cpu", "0")) for c in containers
    )
    return int(spec.get("replicas", 1)) * per_pod


def used_cpu(cluster: ClusterEnv) -> int:
    return millicores(cluster.used("acme", "requests.cpu"))


def deployment(name: str, replicas: int = 2, web_image: str = "nginx:1.25") -> dict[str, Any]:
    """A Deployment of two containers, `web` (500m) and `side` (250m)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": web_image,
                            "resources": {"requests": {"cpu": "500m"}},
                        },
                        {
                            "name": "side",
                            "image": "envoy:1.30",
                            "resources": {"requests": {"cpu": "250m"}},
                        },
                    ]
                },
            },
        },
    }


def stored_deployment(cluster: ClusterEnv, name: str) -> dict[str, Any]:
    status, body = cluster.call(
        "admin", "GET", f"/apis/apps/v1/tenants/acme/namespaces/{NS}/deployments/{name}"
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def containers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def test_describe_configmap(kubectl: Kubectl) -> None:
    """`describe` lists the object's events with kubectl's field selectors
    (`involvedObject.name=…,involvedObject.namespace=…,involvedObject.kind=…,
    involvedObject.uid=…`): the store must accept them."""
    kubectl.ok("alice", "create", "configmap", "described", "--from-literal=colour=green")
    try:
        out = kubectl.ok("alice", "describe", "configmap", "described")
        fields = described(out)
        assert fields["Name"] == "described", out
        assert fields["Namespace"] == NS, out
        assert fields["Events"] == "<none>", out
        assert "colour:" in out, out
        assert "green" in out, out
    finally:
        kubectl.run("alice", "delete", "configmap", "described")


def test_describe_namespace(kubectl: Kubectl) -> None:
    out = kubectl.ok("alice", "describe", "namespace", NS)
    fields = described(out)
    assert fields["Name"] == NS, out
    assert "No resource quota." in out, out


def test_describe_node_as_the_operator_lists_the_pods_on_it(
    kubectl: Kubectl, nodes: dict[str, tuple[str, str]]
) -> None:
    """`describe node` lists the node's pods across all namespaces
    (`fieldSelector=spec.nodeName=N,status.phase!=Succeeded,status.phase!=Failed`):
    a running pod of acme is listed, a finished one is not."""
    pods = {
        "runs-on-a1": "Running",
        "done-on-a1": "Succeeded",
    }
    for name, phase in pods.items():
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": "gpu-a1", "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": phase},
        }
        kubectl.ok("alice", "create", "-f", "-", stdin=json.dumps(pod))
    try:
        out = kubectl.ok("admin", "describe", "node", "gpu-a1")
        fields = described(out)
        assert fields["Name"] == "gpu-a1", out
        assert fields["Non-terminated Pods"] == "(1 in total)", out
        listed = out.split("Non-terminated Pods:", 1)[1].split("Allocated resources:", 1)[0]
        assert "runs-on-a1" in listed, out
        assert "done-on-a1" not in listed, out
    finally:
        for name in pods:
            kubectl.run("alice", "delete", "pod", name)


def test_describe_node_as_its_owner(kubectl: Kubectl, nodes: dict[str, tuple[str, str]]) -> None:
    """A node owner describes its own node (it may not list pods: kubectl says so and
    goes on); another tenant's node is NotFound, as if it did not exist."""
    out = kubectl.ok("nora", "describe", "node", "gpu-a1")
    fields = described(out)
    assert fields["Name"] == "gpu-a1", out
    assert fields["Pods"] == "not authorized", out
    other = kubectl.run("nora", "describe", "node", "gpu-b1")
    assert other.code != 0, other
    assert 'nodes "gpu-b1" not found' in other.err, other


def test_describe_deployment_shows_both_containers(kubectl: Kubectl) -> None:
    kubectl.ok("alice", "create", "-f", "-", stdin=json.dumps(deployment("seen")))
    try:
        out = kubectl.ok("alice", "describe", "deployment", "seen")
        fields = described(out)
        assert fields["Name"] == "seen", out
        assert fields["Replicas"].startswith("2 desired"), out
        assert fields["Selector"] == "app=seen", out
        assert re.search(r"^   web:\n\s+Image:\s+nginx:1.25$", out, re.M), out
        assert re.search(r"^   side:\n\s+Image:\s+envoy:1.30$", out, re.M), out
    finally:
        kubectl.run("alice", "delete", "deployment", "seen")


def test_get_servers_and_nodes_print_the_stores_columns(
    kubectl: Kubectl, nodes: dict[str, tuple[str, str]]
) -> None:
    server = {
        "apiVersion": "compute/v1",
        "kind": "Server",
        "metadata": {"name": "web-1"},
        "spec": {"flavor": "m1.small"},
        "tags": ["prod", "web"],
    }
    kubectl.ok("alice", "create", "-f", "-", stdin=json.dumps(server))
    try:
        out = kubectl.ok("alice", "get", "servers")
        assert header(out) == ["NAME", "TAGS", "STATUS", "AGE"], out
        assert rows(out)["web-1"][1:3] == ["prod,web", "<none>"], out
        out = kubectl.ok("alice", "get", "servers", "-A")
        assert header(out) == ["NAMESPACE", "NAME", "TAGS", "STATUS", "AGE"], out
        assert rows(out)[NS][1] == "web-1", out
    finally:
        kubectl.run("alice", "delete", "server", "web-1")
    out = kubectl.ok("admin", "get", "nodes")
    assert header(out) == ["NAME", "OWNER", "RESOURCE CLASS", "AGE"], out
    table = rows(out)
    for name, (owner, resource_class) in nodes.items():
        assert table[name][1:3] == [owner, resource_class], out
    # The node owner's list is filtered to acme's nodes, and is still a table.
    out = kubectl.ok("nora", "get", "nodes")
    assert header(out) == ["NAME", "OWNER", "RESOURCE CLASS", "AGE"], out
    assert set(rows(out)) == {"gpu-a1", "cpu-a2"}, out
    assert {cells[1] for cells in rows(out).values()} == {"acme"}, out


def test_server_side_apply_twice_changes_nothing_the_second_time(
    kubectl: Kubectl, cluster: ClusterEnv
) -> None:
    base = used_cpu(cluster)
    manifest = json.dumps(deployment("applied"))
    try:
        out = kubectl.ok("alice", "apply", "--server-side", "-f", "-", stdin=manifest)
        assert out.strip() == "deployment.apps/applied serverside-applied", out
        first = stored_deployment(cluster, "applied")
        assert used_cpu(cluster) - base == cpu_of(first) == 1500
        managers = [(m["manager"], m["operation"]) for m in first["metadata"]["managedFields"]]
        assert managers == [("kubectl", "Apply")], managers
        out = kubectl.ok("alice", "apply", "--server-side", "-f", "-", stdin=manifest)
        assert out.strip() == "deployment.apps/applied serverside-applied", out
        again = stored_deployment(cluster, "applied")
        assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        assert again == first
        assert used_cpu(cluster) - base == 1500
    finally:
        kubectl.run("alice", "delete", "deployment", "applied")
    assert used_cpu(cluster) == base


def test_server_side_apply_conflict_and_force(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    """`kubectl set image` takes the image over (manager `kubectl-set`); applying the
    old image again is a conflict naming the manager and the field, nothing changes;
    `--force-conflicts` takes the field back."""
    manifest = json.dumps(deployment("owned"))
    kubectl.ok("alice", "apply", "--server-side", "-f", "-", stdin=manifest)
    try:
        kubectl.ok("alice", "set", "image", "deployment/owned", "web=nginx:1.27")
        before = stored_deployment(cluster, "owned")
        refused = kubectl.run("alice", "apply", "--server-side", "-f", "-", stdin=manifest)
        assert refused.code != 0, refused
        assert 'Apply failed with 1 conflict: conflict with "kubectl-set"' in refused.err, refused
        assert '.spec.template.spec.containers[name="web"].image' in refused.err, refused
        assert "--force-conflicts" in refused.err, refused  # kubectl's advice
        assert stored_deployment(cluster, "owned") == before
        out = kubectl.ok(
            "alice", "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=manifest
        )
        assert out.strip() == "deployment.apps/owned serverside-applied", out
        after = stored_deployment(cluster, "owned")
        assert containers(after)["web"]["image"] == "nginx:1.25"
        assert set(containers(after)) == {"web", "side"}
        # The field is kubectl's again: a plain apply of the same manifest now agrees.
        kubectl.ok("alice", "apply", "--server-side", "-f", "-", stdin=manifest)
        # Another field manager applying a different value conflicts with `kubectl`.
        other = json.dumps(deployment("owned", web_image="nginx:2"))
        refused = kubectl.run(
            "alice", "apply", "--server-side", "--field-manager=ci", "-f", "-", stdin=other
        )
        assert refused.code != 0, refused
        assert 'conflict with "kubectl"' in refused.err, refused
    finally:
        kubectl.run("alice", "delete", "deployment", "owned")


def test_diff_shows_the_change_and_stores_nothing(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    """`kubectl diff` (a dry-run patch; `--server-side`: a dry-run apply): no difference
    exits 0 with no output, a difference exits 1 with the unified diff; nothing is
    stored or charged. (`kubectl create` made the object, so `.spec.replicas` is
    `kubectl-create`'s: a server-side diff that changes it needs `--force-conflicts`.)"""
    kubectl.ok("alice", "create", "-f", "-", stdin=json.dumps(deployment("diffed")))
    base = used_cpu(cluster)
    try:
        for flags in ((), ("--server-side", "--force-conflicts")):
            same = kubectl.run(
                "alice", "diff", *flags, "-f", "-", stdin=json.dumps(deployment("diffed"))
            )
            assert (same.code, same.out) == (0, ""), (flags, same)
            changed = kubectl.run(
                "alice", "diff", *flags, "-f", "-", stdin=json.dumps(deployment("diffed", 5))
            )
            assert changed.code == 1, (flags, changed)
            assert "-  replicas: 2" in changed.out, (flags, changed)
            assert "+  replicas: 5" in changed.out, (flags, changed)
            assert stored_deployment(cluster, "diffed")["spec"]["replicas"] == 2
            assert used_cpu(cluster) == base
    finally:
        kubectl.run("alice", "delete", "deployment", "diffed")


def test_set_image_and_every_patch_type_keep_both_containers_and_the_charge(
    kubectl: Kubectl, cluster: ClusterEnv
) -> None:
    """On a two-container Deployment under acme's cpu quota (8 cpu, QuotaDefaults):
    `set image` and the strategic merge patch (kubectl's default) merge containers by
    name, so the other container survives and no patch directive is stored; `--type
    merge` and `--type json` change what they name. After each, acme's cpu charge is
    what the stored object asks for."""
    base = used_cpu(cluster)

    def charged_as_stored() -> dict[str, Any]:
        obj = stored_deployment(cluster, "shop")
        assert used_cpu(cluster) - base == cpu_of(obj), obj["spec"]
        assert "$setElementOrder" not in json.dumps(obj), obj
        assert "$patch" not in json.dumps(obj), obj
        return obj

    kubectl.ok("alice", "create", "-f", "-", stdin=json.dumps(deployment("shop")))
    try:
        assert cpu_of(charged_as_stored()) == 1500  # 2 x (500m + 250m)
        out = kubectl.ok("alice", "set", "image", "deployment/shop", "web=nginx:1.26")
        assert out.strip() == "deployment.apps/shop image updated", out
        obj = charged_as_stored()
        assert {n: c["image"] for n, c in containers(obj).items()} == {
            "web": "nginx:1.26",
            "side": "envoy:1.30",
        }
        side_cpu = {"name": "side", "resources": {"requests": {"cpu": "500m"}}}
        strategic = {"spec": {"template": {"spec": {"containers": [side_cpu]}}}}
        out = kubectl.ok("alice", "patch", "deployment", "shop", "-p", json.dumps(strategic))
        assert out.strip() == "deployment.apps/shop patched", out
        obj = charged_as_stored()
        assert cpu_of(obj) == 2000  # 2 x (500m + 500m)
        assert containers(obj)["web"]["image"] == "nginx:1.26"
        kubectl.ok(
            "alice",
            "patch",
            "deployment",
            "shop",
            "--type",
            "merge",
            "-p",
            '{"spec":{"replicas":3}}',
        )
        assert cpu_of(charged_as_stored()) == 3000
        replace_web = [
            {
                "op": "replace",
                "path": "/spec/template/spec/containers/0/resources/requests/cpu",
                "value": "1",
            }
        ]
        kubectl.ok(
            "alice", "patch", "deployment", "shop", "--type", "json", "-p", json.dumps(replace_web)
        )
        obj = charged_as_stored()
        assert cpu_of(obj) == 4500  # 3 x (1 + 500m)
        assert set(containers(obj)) == {"web", "side"}
        # Over the quota: refused whatever the patch type, nothing changed or charged.
        for args in (
            ("-p", '{"spec":{"replicas":6}}'),
            ("--type", "merge", "-p", '{"spec":{"replicas":6}}'),
            ("--type", "json", "-p", '[{"op":"replace","path":"/spec/replicas","value":6}]'),
        ):
            refused = kubectl.run("alice", "patch", "deployment", "shop", *args)
            assert refused.code != 0, refused
            assert "exceeded quota in tenant acme: requests.cpu" in refused.err, refused
            assert charged_as_stored() == obj
    finally:
        kubectl.run("alice", "delete", "deployment", "shop")
    assert used_cpu(cluster) == base


def test_delete_answers_kubernetes_status(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    """An immediate DELETE answers a `Status` of success naming the object (kind is the
    resource plural, as from Kubernetes), through the sidecar unchanged; kubectl prints
    its usual line, and the charge is returned."""
    kubectl.ok("alice", "create", "configmap", "doomed")
    kubectl.ok("alice", "create", "configmap", "doomed-too")
    uid = kubectl.ok("alice", "get", "configmap", "doomed", "-o", "jsonpath={.metadata.uid}")
    before = int(cluster.used("acme", "configmaps"))
    out = kubectl.ok("alice", "delete", "--raw", f"/api/v1/namespaces/{NS}/configmaps/doomed")
    assert json.loads(out) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "doomed", "kind": "configmaps", "uid": uid},
    }
    out = kubectl.ok("alice", "delete", "configmap", "doomed-too")
    assert out.strip() == 'configmap "doomed-too" deleted', out
    assert int(cluster.used("acme", "configmaps")) == before - 2
    again = kubectl.run("alice", "delete", "configmap", "doomed")
    assert again.code != 0, again
    assert 'configmaps "doomed" not found' in again.err, again


# (arguments, what kubectl says) for commands the store does not serve (docs/kubectl.md)
NOT_SERVED: list[tuple[tuple[str, ...], str]] = [
    (("scale", "deployment", "idle", "--replicas=3"), "deployments have no subresource 'scale'"),
    (("autoscale", "deployment", "idle", "--max=3"), "could not find scale subresource"),
    (("logs", "quiet"), "pods have no subresource 'log'"),
    (("exec", "quiet", "--", "ls"), "pods have no subresource 'exec'"),
    (("cp", "quiet:/etc/hosts", "hosts"), "pods have no subresource 'exec'"),
    (
        ("debug", "quiet", "--image=busybox", "--profile=general"),
        "ephemeral containers are disabled for this cluster",
    ),
    (("top", "pod"), "Metrics API not available"),
    (("explain", "deployment"), 'couldn\'t find resource for "apps/v1, Kind=Deployment"'),
    (("create", "token", "default"), "protobuf bodies of kind TokenRequest"),
]


@pytest.fixture(scope="module")
def idle(kubectl: Kubectl) -> Iterator[None]:
    """A pod `quiet` and a deployment `idle` (no replicas) in acme's ns1."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "quiet"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    kubectl.ok("alice", "create", "-f", "-", stdin=json.dumps(pod))
    kubectl.ok("alice", "create", "-f", "-", stdin=json.dumps(deployment("idle", replicas=0)))
    yield
    kubectl.run("alice", "delete", "pod", "quiet")
    kubectl.run("alice", "delete", "deployment", "idle")


@pytest.mark.parametrize(("args", "says"), NOT_SERVED, ids=[" ".join(a[:2]) for a, _ in NOT_SERVED])
def test_commands_the_store_does_not_serve_fail_clearly(
    kubectl: Kubectl, idle: None, args: tuple[str, ...], says: str
) -> None:
    """What docs/kubectl.md says does not work, with the message it quotes: exit 1,
    never a kubectl crash (a 404 without `details` made `kubectl debug` panic)."""
    result = kubectl.run("alice", *args)
    assert result.code == 1, result
    assert says in result.err, result
    assert "panic" not in result.err, result

"""An operator's day with the real `kubectl` (issue 29 items 1-4), against the real
sidecar (HTTPS) and the real store (the `cluster` fixture, tests/rigs/cluster.py).

- Tenant contexts: `sidecar kubeconfig --tenant acme --tenant beta` writes one context
  per tenant (server URL `…/tenants/{t}`); `kubectl label` through beta's context
  changes beta's `web` and no other tenant's; `get cm -A` as the operator without a
  context shows a TENANT column.
- `kubectl auth can-i '*' '*'`: yes for the cluster admin and a tenant admin, no for a
  viewer (with a true reason).
- `kubectl --as alice` from an operator: an answer that says alice is of tenant
  `system` and how to name a tenant; the `as-user-extra` context acts as alice of acme.
- `kubectl drain` of a node with pods, through a tenant context: evicted (and, with
  `--disable-eviction`, deleted with a protobuf DeleteOptions body), the other tenant's
  pod on that node untouched, the quota charge returned.
- `kubectl get nodes -w` with an owner-only grant: the owned nodes, no error, and a
  node given away prints once more with empty columns, never the other tenant's data.
- Bad contexts: a tenant that does not exist and one the caller is not of give the
  missing tenant's 404; a malformed prefix, 400. `kubectl create token`'s 415 says what
  to run instead.

The tests skip only where kubectl is absent, never under `CI=true`.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.rigs.cluster import NS, USERS, ClusterEnv, kubeconfig


@dataclass
class Result:
    code: int
    out: str
    err: str


class Kubectl:
    def __init__(self, binary: str, env: ClusterEnv) -> None:
        self.binary = binary
        self.env = env
        home = env.tmp / "ops-home"
        home.mkdir(exist_ok=True)
        self.environ = {**os.environ, "HOME": str(home), "KUBECACHEDIR": str(home / "cache")}
        self.environ.pop("KUBECONFIG", None)

    def config(self, user: str) -> Path:
        return self.env.kubeconfigs[user]

    def run(self, config: Path, *args: str, context: str | None = None) -> Result:
        ctx = ["--context", context] if context else []
        proc = subprocess.run(
            [self.binary, "--kubeconfig", str(config), *ctx, "--request-timeout=20s", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.environ,
            check=False,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def ok(self, config: Path, *args: str, context: str | None = None) -> str:
        result = self.run(config, *args, context=context)
        assert result.code == 0, f"kubectl {' '.join(args)} ({context}): {result.err}{result.out}"
        return result.out

    def popen(self, config: Path, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.binary, "--kubeconfig", str(config), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.environ,
        )


@pytest.fixture(scope="module")
def kubectl(cluster: ClusterEnv, kubectl_binary: str) -> Kubectl:
    return Kubectl(kubectl_binary, cluster)


def sidecar_kubeconfig(env: ClusterEnv, name: str, *args: str) -> Path:
    """The operator's kubeconfig as `sidecar kubeconfig` writes it (the real command)."""
    token = env.tmp / "admin.token"
    token.write_text(USERS["admin"][0])
    out = env.tmp / name
    command = [sys.executable, "-c", "from sidecar.cli.main import main; raise SystemExit(main())"]
    where = ["--server", env.url, "--token-file", str(token), "--ca-file", str(env.ca_file)]
    proc = subprocess.run(
        [*command, "kubeconfig", *where, "--namespace", NS, "-o", str(out), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def ops(cluster: ClusterEnv) -> Path:
    return sidecar_kubeconfig(cluster, "ops.kubeconfig", "--tenant", "acme", "--tenant", "beta")


def test_label_through_a_tenant_context_changes_that_tenants_object(
    kubectl: Kubectl, cluster: ClusterEnv, ops: Path
) -> None:
    admin = kubectl.config("admin")
    kubectl.run(admin, "create", "namespace", NS)  # the default tenant's ns1
    kubectl.ok(admin, "create", "configmap", "web", "--from-literal=t=default", "-n", NS)
    kubectl.ok(kubectl.config("alice"), "create", "configmap", "web", "--from-literal=t=acme")
    kubectl.ok(kubectl.config("bob"), "create", "configmap", "web", "--from-literal=t=beta")
    # Without a context the operator sees every tenant, with a TENANT column.
    table = kubectl.ok(admin, "get", "configmaps", "-A")
    header = table.splitlines()[0].split()
    assert header[:3] == ["NAMESPACE", "TENANT", "NAME"], table
    assert {line.split()[1] for line in table.splitlines()[1:]} >= {"acme", "beta", "default"}
    # In beta's context the operator's list and label are beta's.
    names = kubectl.ok(ops, "get", "configmaps", "-A", "-o", "name", context="beta").split()
    assert names == ["configmap/web"]
    kubectl.ok(ops, "label", "configmap", "web", "tier=front", context="beta")
    labels = {
        user: json.loads(kubectl.ok(kubectl.config(user), "get", "cm", "web", "-o", "json"))[
            "metadata"
        ].get("labels", {})
        for user in ("alice", "bob")
    }
    assert labels == {"alice": {}, "bob": {"tier": "front"}}
    default = json.loads(kubectl.ok(admin, "get", "cm", "web", "-n", NS, "-o", "json"))
    assert "labels" not in default["metadata"]
    # kubectl create (a protobuf body) in acme's context lands in acme.
    kubectl.ok(ops, "create", "configmap", "made-by-operator", context="acme")
    assert "configmap/made-by-operator" in kubectl.ok(
        kubectl.config("alice"), "get", "cm", "-o", "name"
    )


def test_can_i_everything(kubectl: Kubectl, ops: Path) -> None:
    for config, context in (
        (kubectl.config("admin"), None),
        (kubectl.config("alice"), None),
        (ops, "acme"),
    ):
        result = kubectl.run(config, "auth", "can-i", "*", "*", context=context)
        assert (result.code, result.out.split()[:1]) == (0, ["yes"]), (context, result)
    viewer = kubectl.run(kubectl.config("vera"), "auth", "can-i", "*", "*")
    assert viewer.code == 1
    assert viewer.out.startswith("no - ")
    assert 'User "vera" of tenant "acme"' in viewer.out
    assert "outside the caller's tenant" not in viewer.out


def test_as_alice_from_an_operator(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    admin = kubectl.config("admin")
    refused = kubectl.run(admin, "--as", "alice", "get", "configmaps")
    assert refused.code == 1
    assert 'tenants "default" not found' not in refused.err
    assert 'of tenant "system"' in refused.err
    assert "as-user-extra" in refused.err
    answer = kubectl.run(admin, "--as", "alice", "auth", "can-i", "get", "configmaps")
    assert answer.code == 1
    assert "as-user-extra" in answer.out
    # The as-user-extra form acts as alice of acme.
    acting = sidecar_kubeconfig(
        cluster, "as-alice.kubeconfig", "--as", "alice", "--as-tenant", "acme",
        "--as-group", "tenant-admins",
    )  # fmt: skip
    config = yaml.safe_load(acting.read_text())
    user = next(u["user"] for u in config["users"] if u["name"] == "alice@acme")
    assert user["as-user-extra"] == {"tenant": ["acme"]}
    whoami = kubectl.ok(acting, "auth", "whoami", "-o", "json", context="alice@acme")
    info = json.loads(whoami)["status"]["userInfo"]
    assert (info["username"], info["extra"]["tenant"]) == ("alice", ["acme"])
    assert "configmap/web" in kubectl.ok(acting, "get", "cm", "-o", "name", context="alice@acme")


def _pod(name: str, node: str) -> str:
    container = {"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}
    spec = {"nodeName": node, "containers": [container]}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def _create_pods(kubectl: Kubectl, user: str, node: str, *names: str) -> None:
    for name in names:
        proc = subprocess.run(
            [kubectl.binary, "--kubeconfig", str(kubectl.config(user)), "create", "-f", "-"],
            input=_pod(name, node),
            capture_output=True,
            text=True,
            env=kubectl.environ,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("how", ["evict", "delete"])
def test_drain_a_node_through_a_tenant_context(
    kubectl: Kubectl, cluster: ClusterEnv, ops: Path, how: str
) -> None:
    admin = kubectl.config("admin")
    node = f"drain-{how}"
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    status, body = cluster.call("admin", "POST", "/api/v1/nodes", {**manifest, "spec": {}})
    assert status == 201, body
    before = int(cluster.used("acme", "pods"))
    _create_pods(kubectl, "alice", node, f"{how}-1", f"{how}-2")
    _create_pods(kubectl, "bob", node, f"{how}-beta")
    assert int(cluster.used("acme", "pods")) == before + 2
    extra = ["--disable-eviction"] if how == "delete" else []
    out = kubectl.ok(
        ops, "drain", node, "--force", "--ignore-daemonsets", "--delete-emptydir-data",
        "--grace-period=0", "--timeout=60s", *extra, context="acme",
    )  # fmt: skip
    assert f"node/{node} drained" in out, out
    verb = "evicted" if how == "evict" else "deleted"
    assert f"pod/{how}-1 {verb}" in out, out
    acme = kubectl.ok(kubectl.config("alice"), "get", "pods", "-o", "name").split()
    assert f"pod/{how}-1" not in acme
    assert f"pod/{how}-2" not in acme
    beta = kubectl.ok(kubectl.config("bob"), "get", "pods", "-o", "name").split()
    assert f"pod/{how}-beta" in beta  # another tenant's pod on that node: untouched
    assert int(cluster.used("acme", "pods")) == before
    node_doc = json.loads(kubectl.ok(admin, "get", "node", node, "-o", "json"))
    assert node_doc["spec"]["unschedulable"] is True
    kubectl.run(kubectl.config("bob"), "delete", "pod", f"{how}-beta")


class Lines:
    """A process's stdout lines as they come (a reader thread: a pipe read by lines
    buffers more than one, which `select` would not see)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                self.queue.put(line)
            self.queue.put(None)

        threading.Thread(target=read, daemon=True).start()

    def until(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """The lines up to the first one `predicate` accepts (or all by `timeout`)."""
        seen = ""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return seen
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                return seen
            if line is None:
                return seen
            seen += line
            if predicate(line):
                return seen


def test_get_nodes_watch_with_an_owner_only_grant(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    for name, owner in (("w-mine", "acme"), ("w-theirs", "beta")):
        node = {"metadata": {"name": name}, "spec": {"owner": owner, "resource_class": "gpu"}}
        status, body = cluster.call("admin", "POST", "/api/v1/nodes", node)
        assert status == 201, body
    watch = kubectl.popen(kubectl.config("nora"), "get", "nodes", "-w")
    lines = Lines(watch)
    try:
        first = lines.until(lambda line: "w-mine" in line, 30)
        assert "w-mine" in first, first
        # Events: a change of beta's node is never shown; acme's are.
        status, _ = _patch(cluster, "w-theirs", {"metadata": {"labels": {"x": "1"}}})
        assert status == 200
        status, _ = _patch(cluster, "w-mine", {"metadata": {"labels": {"x": "1"}}})
        assert status == 200
        status, _ = _patch(cluster, "w-mine", {"spec": {"owner": "beta"}})
        assert status == 200
        later = lines.until(lambda line: "w-mine" in line, 30)
        later += lines.until(lambda line: "w-mine" in line, 30)
        rows = [line.split() for line in later.splitlines()]
        assert [r[0] for r in rows] == ["w-mine", "w-mine"], later
        assert rows[0][1] == "acme"
        assert rows[1] == ["w-mine"]  # it left acme's view: nothing of beta's shown
        assert "w-theirs" not in first + later
        assert "beta" not in first + later
    finally:
        watch.terminate()
        _, err = watch.communicate(timeout=10)
    assert "Error" not in err, err


def _patch(cluster: ClusterEnv, name: str, patch: dict[str, object]) -> tuple[int, object]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{cluster.url}/api/v1/nodes/{name}", data=json.dumps(patch).encode(), method="PATCH"
    )
    request.add_header("Authorization", f"Bearer {USERS['admin'][0]}")
    request.add_header("Content-Type", "application/merge-patch+json")
    try:
        with urllib.request.urlopen(request, timeout=20, context=cluster.trust) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_bad_contexts(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    def config(user: str, suffix: str) -> Path:
        path = cluster.tmp / f"{user}-{suffix.replace('/', '_')}.kubeconfig"
        token = USERS[user][0]
        path.write_text(kubeconfig(cluster.url + suffix, cluster.ca_file, user, token, NS))
        return path

    for user, suffix, tenant in (
        ("admin", "/tenants/nosuch", "nosuch"),
        ("bob", "/tenants/acme", "acme"),
        ("alice", "/tenants/beta", "beta"),
    ):
        result = kubectl.run(config(user, suffix), "get", "configmaps")
        assert result.code == 1, result
        assert "NotFound" in result.err, result
        # `--raw` paths are the server's own (kubectl drops the context's path): the
        # same request with the prefix written out shows the answer's message.
        raw = f"{suffix}/api/v1/namespaces/{NS}/configmaps"
        result = kubectl.run(kubectl.config(user), "get", "--raw", raw)
        assert result.code == 1, result
        assert f'tenants \\"{tenant}\\" not found' in result.err or (
            f'tenants "{tenant}" not found' in result.err
        ), result
    for suffix in ("/tenants/Not_A_Tenant", "/tenants/-x-", "/tenants//x"):
        result = kubectl.run(kubectl.config("admin"), "get", "--raw", f"{suffix}/api")
        assert result.code == 1, result
        assert "BadRequest" in result.err or "Bad Request" in result.err, result
    # kubectl create token: a protobuf kind the sidecar does not read; the 415 says
    # what a kubectl user can run instead.
    kubectl.run(kubectl.config("alice"), "create", "serviceaccount", "robot")
    token = kubectl.run(kubectl.config("alice"), "create", "token", "robot")
    assert token.code == 1
    path = f"/api/v1/tenants/acme/namespaces/{NS}/serviceaccounts/robot/token"
    assert f"kubectl create --raw {path} -f" in token.err, token.err

"""`kubectl create role|rolebinding|quota` end to end (issue 30): the real kubectl
(protobuf bodies) through the real sidecar (HTTPS, shipped policies) and the real store.
A tenant admin's Role and RoleBinding grant a user of its tenant what kubectl asked; a
quota made with kubectl is enforced on the next create; an escalating role from a user
without the rules is refused with kubectl's own message. Skips only where kubectl is
absent, never under CI=true."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import pytest

from tests.rigs.cluster import ClusterEnv


class Kubectl:
    def __init__(self, binary: str, cluster: ClusterEnv) -> None:
        self.binary = binary
        self.cluster = cluster
        home = cluster.tmp / "home-api-policy"
        home.mkdir(exist_ok=True)
        self.environ = {**os.environ, "HOME": str(home), "KUBECACHEDIR": str(home / "cache")}
        self.environ.pop("KUBECONFIG", None)

    def run(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, "--kubeconfig", str(self.cluster.kubeconfigs[user]), *args],
            capture_output=True,
            text=True,
            timeout=90,
            env=self.environ,
            check=False,
        )

    def ok(self, user: str, *args: str) -> str:
        result = self.run(user, *args)
        assert result.returncode == 0, f"kubectl {' '.join(args)} as {user}: {result.stderr}"
        return result.stdout


@pytest.fixture(scope="module")
def kubectl(cluster: ClusterEnv, kubectl_binary: str) -> Kubectl:
    return Kubectl(kubectl_binary, cluster)


def until(condition: Callable[[], bool], within: float = 2.0) -> None:
    """Poll (kubectl is a process: no event to wait on) until `condition` holds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not in force within 2 s"
        time.sleep(0.05)  # the polling interval


def test_kubectl_role_and_rolebinding_grant(kubectl: Kubectl) -> None:
    ns = "apk"
    kubectl.ok("alice", "create", "namespace", ns)
    assert kubectl.run("vera", "-n", ns, "create", "configmap", "c0").returncode != 0
    kubectl.ok(
        "alice",
        "-n",
        ns,
        "create",
        "role",
        "cm-writer",
        "--verb=get,list,create",
        "--resource=configmaps",
    )
    kubectl.ok(
        "alice", "-n", ns, "create", "rolebinding", "vera-w", "--role=cm-writer", "--user=vera"
    )
    until(
        lambda: (
            kubectl.run("vera", "-n", ns, "auth", "can-i", "create", "configmaps").returncode == 0
        )
    )
    kubectl.ok("vera", "-n", ns, "create", "configmap", "c1")
    assert kubectl.run("vera", "-n", "ns1", "auth", "can-i", "create", "configmaps").returncode != 0
    kubectl.ok("alice", "-n", ns, "delete", "rolebinding", "vera-w")
    until(
        lambda: (
            kubectl.run("vera", "-n", ns, "auth", "can-i", "create", "configmaps").returncode != 0
        )
    )


def test_kubectl_escalating_role_is_refused(kubectl: Kubectl) -> None:
    ns = "apk-esc"
    kubectl.ok("alice", "create", "namespace", ns)
    kubectl.ok(
        "alice",
        "-n",
        ns,
        "create",
        "role",
        "rbac-w",
        "--verb=get,list,create",
        "--resource=roles,rolebindings",
    )
    kubectl.ok(
        "alice", "-n", ns, "create", "rolebinding", "vera-rbac", "--role=rbac-w", "--user=vera"
    )
    until(lambda: kubectl.run("vera", "-n", ns, "auth", "can-i", "create", "roles").returncode == 0)
    result = kubectl.run(
        "vera", "-n", ns, "create", "role", "steal", "--verb=get", "--resource=secrets"
    )
    assert result.returncode != 0
    assert "not currently held" in result.stderr
    assert kubectl.run("alice", "-n", ns, "get", "role", "steal").returncode != 0


def test_kubectl_quota_is_enforced(kubectl: Kubectl) -> None:
    ns = "apk-quota"
    kubectl.ok("alice", "create", "namespace", ns)
    kubectl.ok("alice", "-n", ns, "create", "quota", "q", "--hard=configmaps=1,cpu=1,memory=1G")
    until(
        lambda: (
            "configmaps"
            in kubectl.cluster.call("alice", "GET", f"/quota/v1/tenants/acme/namespaces/{ns}")[
                1
            ].__str__()
        )
    )
    kubectl.ok("alice", "-n", ns, "create", "configmap", "one")
    result = kubectl.run("alice", "-n", ns, "create", "configmap", "two")
    assert result.returncode != 0
    assert "quota" in result.stderr.lower()
    result = kubectl.run("alice", "-n", ns, "create", "quota", "bad", "--hard=widgets=3")
    assert result.returncode != 0
    assert "spec.hard.widgets" in result.stderr


def test_kubectl_warns_that_cluster_roles_written_through_the_api_are_not_in_force(
    kubectl: Kubectl,
) -> None:
    result = kubectl.run(
        "admin", "create", "clusterrole", "cr-api", "--verb=get", "--resource=pods"
    )
    assert result.returncode == 0, result.stderr
    assert "not in force" in result.stderr

"""The policies deploy/kubernetes ships (issue 29 item 6): the ConfigMap
`sidecar-policies` is the repository's policies/ byte for byte, carries the discovery
binding, and, loaded exactly as the manifests ship it (its data files written to a
directory, as the kubelet mounts them), lets a tenant user's real `kubectl get` through
a real sidecar. Without the discovery binding the same kubectl fails: the check can
fail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.rigs import paths
from tests.rigs.cluster import ClusterEnv, start_cluster, stop_cluster

CONFIGMAP = paths.ROOT / "deploy" / "kubernetes" / "policies-configmap.yaml"


def _configmap() -> dict[str, Any]:
    doc = yaml.safe_load(CONFIGMAP.read_text())
    assert doc["kind"] == "ConfigMap"
    assert doc["metadata"]["name"] == "sidecar-policies"
    data: dict[str, Any] = doc["data"]
    return data


def _mount(data: dict[str, str], into: Path) -> Path:
    """The ConfigMap's files as the kubelet mounts them: one file per key."""
    into.mkdir()
    for name, text in data.items():
        assert "/" not in name
        (into / name).write_bytes(text.encode())
    return into


def test_the_configmap_is_the_shipped_policies_byte_for_byte() -> None:
    data = _configmap()
    shipped = {p.name for p in paths.SHIPPED_POLICIES.iterdir() if p.is_file()}
    assert set(data) == shipped, "run: bash deploy/policies-configmap.sh"
    for name, text in data.items():
        assert text.encode() == (paths.SHIPPED_POLICIES / name).read_bytes(), (
            f"{name} differs from policies/{name}: run bash deploy/policies-configmap.sh"
        )


def test_the_configmap_carries_the_discovery_binding() -> None:
    docs = [d for text in _configmap().values() for d in yaml.safe_load_all(text) if d]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    bindings = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding"
        and {"kind": "Group", "name": "system:authenticated"} in d["subjects"]
    ]
    assert bindings, "no ClusterRoleBinding for system:authenticated"
    urls = {
        url
        for b in bindings
        for rule in roles[b["roleRef"]["name"]]["rules"]
        for url in rule.get("nonResourceURLs", [])
    }
    assert {"/api", "/apis", "/apis/*", "/version"} <= urls


class _Kubectl:
    def __init__(self, binary: str, env: ClusterEnv) -> None:
        self.binary, self.env = binary, env
        home = env.tmp / "home"
        home.mkdir(exist_ok=True)
        self.environ = {**os.environ, "HOME": str(home), "KUBECACHEDIR": str(home / "cache")}
        self.environ.pop("KUBECONFIG", None)

    def run(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, "--kubeconfig", str(self.env.kubeconfigs[user]), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.environ,
            check=False,
        )


def test_a_tenant_users_kubectl_get_works_with_the_shipped_configmap(
    tmp_path: Path, kubectl_binary: str
) -> None:
    policies = _mount(_configmap(), tmp_path / "etc-sidecar-policies")
    env = start_cluster(tmp_path, policies=policies)
    try:
        status, body = env.call(
            "alice",
            "POST",
            "/api/v1/namespaces/ns1/configmaps",
            {"metadata": {"name": "web"}, "data": {"a": "b"}},
        )
        assert status == 201, body
        kubectl = _Kubectl(kubectl_binary, env)
        for user, args, shown in [
            ("alice", ["get", "configmaps"], "web"),  # acme's tenant admin
            ("alice", ["get", "cm", "web", "-o", "name"], "configmap/web"),  # a short name
            ("vera", ["get", "configmaps"], "web"),  # acme's viewer
            ("bob", ["get", "configmaps"], "No resources found"),  # beta's admin: not acme's
        ]:
            done = kubectl.run(user, *args)
            assert done.returncode == 0, f"kubectl {args} as {user}: {done.stderr}{env.log()}"
            assert shown in done.stdout + done.stderr, done.stdout + done.stderr
    finally:
        stop_cluster(env)


def test_without_the_discovery_binding_a_tenant_users_kubectl_fails(
    tmp_path: Path, kubectl_binary: str
) -> None:
    """The control: the ConfigMap as it shipped before (no discovery binding)."""
    data = dict(_configmap())
    docs = [d for d in yaml.safe_load_all(data["00-cluster-admin.yaml"]) if d]
    kept = [d for d in docs if d["metadata"]["name"] != "discovery"]
    assert len(kept) < len(docs)
    data["00-cluster-admin.yaml"] = yaml.safe_dump_all(kept)
    env = start_cluster(tmp_path, policies=_mount(data, tmp_path / "policies"))
    try:
        done = _Kubectl(kubectl_binary, env).run("alice", "get", "configmaps")
        assert done.returncode != 0
        assert "Forbidden" in done.stderr or "forbidden" in done.stderr, done.stderr
    finally:
        stop_cluster(env)

"""A cluster as a user sees it: the real store and the real sidecar serving HTTPS with a
certificate from a CA made here (`cryptography`), the shipped policies, tenants acme and
beta with namespace ns1 each, and a kubeconfig per user (that CA, a static token): the
operator `admin`, acme's tenant admin `alice`, viewer `vera` and node owner `nora`, and
beta's tenant admin `bob`.
Used by the kubectl and the Python client end-to-end tests through the module-scoped
`cluster` fixture of tests/system/conftest.py."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sidecar.cli.demo import Authority
from tests.rigs import paths, processes

SHIPPED_POLICIES = paths.SHIPPED_POLICIES
# name → (token, user, tenant, groups), bound by the shipped policies.
USERS: dict[str, tuple[str, str, str, list[str]]] = {
    "admin": ("admin-token", "admin", "system", []),
    "alice": ("alice-token", "alice", "acme", ["tenant-admins"]),
    "vera": ("vera-token", "vera", "acme", ["viewers"]),
    "bob": ("bob-token", "bob", "beta", ["tenant-admins"]),
    # acme's node owner: no grant but the shipped owner rule on nodes (40-node-owner.yaml).
    "nora": ("nora-token", "nora", "acme", ["node-owners"]),
}
NS = "ns1"


# -- a CA and a server certificate: the demo's own `Authority` --------------------------


def make_ca(cn: str) -> Authority:
    """A certificate authority made here (the one `sidecar demo` uses)."""
    return Authority(cn)


# -- the sidecar over HTTPS, the store, kubeconfigs ---------------------------------------


def kubeconfig(server: str, ca_file: Path, user: str, token: str, namespace: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sidecar",
                    "cluster": {"server": server, "certificate-authority": str(ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": user,
                    "context": {"cluster": "sidecar", "user": user, "namespace": namespace},
                }
            ],
            "current-context": user,
        }
    )


@dataclass
class ClusterEnv:
    """The store and the sidecar (HTTPS), tenants acme and beta with namespace ns1 each,
    and a kubeconfig per user in `kubeconfigs`."""

    url: str
    tmp: Path
    ca_file: Path
    trust: ssl.SSLContext
    kubeconfigs: dict[str, Path] = field(default_factory=dict)
    procs: list[processes.Proc] = field(default_factory=list)

    def call(self, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request over HTTPS as `user` (JSON in, JSON out)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {USERS[user][0]}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=20, context=self.trust) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        return status, json.loads(raw) if raw else None

    def used(self, tenant: str, resource: str) -> str:
        """The quota's `used` of one resource in a tenant (the admin asks)."""
        status, usage = self.call("admin", "GET", f"/quota/v1/tenants/{tenant}/usage")
        assert status == 200, usage
        return str(usage["usage"].get(resource, {"used": 0})["used"])

    def log(self) -> str:
        return "\n".join(p.log()[-4000:] for p in self.procs)


def start_cluster(
    tmp: Path, policies: Path = SHIPPED_POLICIES, extra: dict[str, Any] | None = None
) -> ClusterEnv:
    """`policies`: the policy directory the sidecar runs (default the shipped one);
    `extra`: more sidecar config keys."""
    ca = make_ca("e2e test CA")
    cert_pem, key_pem = ca.issue()
    ca_file, cert_file, key_file = tmp / "ca.crt", tmp / "tls.crt", tmp / "tls.key"
    ca_file.write_bytes(ca.cert_pem)
    cert_file.write_bytes(cert_pem)
    key_file.write_bytes(key_pem)
    key_file.chmod(0o600)
    tokens = processes.write_tokens(
        tmp,
        [
            {"token": token, "user": user, "tenant": tenant, "groups": groups}
            for token, user, tenant, groups in USERS.values()
        ],
    )
    store = processes.start_store(tmp)
    config = {
        "upstream": store.url,
        "policies": str(policies),
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
        "tls": {"certFile": str(cert_file), "keyFile": str(key_file)},
        **(extra or {}),
    }
    trust = ssl.create_default_context(cafile=str(ca_file))
    try:
        sidecar = processes.start_sidecar(tmp, config, tls=trust)
    except BaseException:
        store.stop()  # a sidecar that fails to start leaves no store behind
        raise
    env = ClusterEnv(
        f"https://127.0.0.1:{sidecar.port}", tmp, ca_file, trust, procs=[store, sidecar]
    )
    try:
        for tenant in ("acme", "beta"):
            status, body = env.call(
                "admin", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
            )
            assert status == 201, body
            status, body = env.call(
                "admin", "POST", f"/api/v1/tenants/{tenant}/namespaces", {"metadata": {"name": NS}}
            )
            assert status == 201, body
        for name, (token, *_rest) in USERS.items():
            path = tmp / f"{name}.kubeconfig"
            path.write_text(kubeconfig(env.url, ca_file, name, token, NS))
            env.kubeconfigs[name] = path
    except BaseException:
        stop_cluster(env)
        raise
    return env


def stop_cluster(env: ClusterEnv) -> None:
    for proc in reversed(env.procs):
        proc.stop()

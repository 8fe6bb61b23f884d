"""The real `kubectl` against the real sidecar (HTTPS) and the real store (issue 14).

The sidecar serves TLS with a certificate from a CA made here (`cryptography`), runs the
shipped `policies/`, and every user has a kubeconfig with that CA and a static token.
What a new user would try: discovery, get/create/label/delete with label selectors,
`create configmap` (a protobuf body), `--dry-run=server`, a watch, `auth can-i` (yes,
no, `--list`), `auth whoami`, and isolation as before: another tenant's objects stay
404 and never show in lists. A kubeconfig with the wrong CA fails the TLS handshake;
an unknown token is 401.

The tests skip only where kubectl is absent, never under `CI=true`. `ClusterEnv` is
shared with the Python client's tests (tests/test_k8s_client_e2e.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests import harness

SHIPPED_POLICIES = harness.ROOT / "policies"
# name → (token, user, tenant, groups), bound by the shipped policies.
USERS: dict[str, tuple[str, str, str, list[str]]] = {
    "admin": ("admin-token", "admin", "system", []),
    "alice": ("alice-token", "alice", "acme", ["tenant-admins"]),
    "vera": ("vera-token", "vera", "acme", ["viewers"]),
    "bob": ("bob-token", "bob", "beta", ["tenant-admins"]),
}
NS = "ns1"


# -- a CA and a server certificate ------------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for 127.0.0.1 and localhost, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("sidecar"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


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
    procs: list[harness.Proc] = field(default_factory=list)

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


def _wait_https(env: ClusterEnv, proc: harness.Proc, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"sidecar exited with {proc.proc.returncode}:\n{proc.log()}")
        try:
            with urllib.request.urlopen(f"{env.url}/healthz", timeout=1, context=env.trust):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the sidecar did not answer HTTPS within {timeout}s:\n{proc.log()}")


def start_cluster(tmp: Path) -> ClusterEnv:
    ca_key, ca = make_ca("e2e test CA")
    cert_pem, key_pem = make_server_cert(ca_key, ca)
    ca_file, cert_file, key_file = tmp / "ca.crt", tmp / "tls.crt", tmp / "tls.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert_pem)
    key_file.write_bytes(key_pem)
    key_file.chmod(0o600)
    tokens = harness.write_tokens(
        tmp,
        [
            {"token": token, "user": user, "tenant": tenant, "groups": groups}
            for token, user, tenant, groups in USERS.values()
        ],
    )
    store = harness.start_store(tmp)
    port = harness.free_port()
    config = {
        "upstream": store.url,
        "policies": str(SHIPPED_POLICIES),
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
        "tls": {"certFile": str(cert_file), "keyFile": str(key_file)},
    }
    sidecar = harness.start_sidecar(tmp, config, port=port, wait=False)
    trust = ssl.create_default_context(cafile=str(ca_file))
    env = ClusterEnv(f"https://127.0.0.1:{port}", tmp, ca_file, trust, procs=[store, sidecar])
    try:
        _wait_https(env, sidecar)
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterEnv]:
    env = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield env
    stop_cluster(env)


# -- kubectl ------------------------------------------------------------------------------


def kubectl_path() -> str:
    found = shutil.which("kubectl")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is not installed (CI=true: this is a failure)")
        pytest.skip("kubectl is not installed")
    return found


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
def kubectl(cluster: ClusterEnv) -> Kubectl:
    return Kubectl(kubectl_path(), cluster)


def test_discovery_lists_resources_with_short_names(kubectl: Kubectl) -> None:
    out = kubectl.ok("alice", "api-resources", "--no-headers")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert "configmaps" in rows and "cm" in rows["configmaps"], out
    assert "servers" in rows, out
    assert kubectl.names("alice", "cm") == set()  # a short name works, and ns1 is empty


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
    assert "get" in verbs and "list" in verbs and "delete" not in verbs, out


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
        assert missing.code != 0 and "NotFound" in missing.err, missing
        assert "configmap/secret-plans" not in kubectl.names("bob", "cm")
        # Naming acme's tenant path: the same 404 a tenant that does not exist gets.
        raw = kubectl.run(
            "bob", "get", "--raw", f"/api/v1/tenants/acme/namespaces/{NS}/configmaps/secret-plans"
        )
        assert raw.code != 0 and "NotFound" in raw.err, raw
        listed = kubectl.run(
            "bob", "get", "--raw", f"/api/v1/tenants/acme/namespaces/{NS}/configmaps"
        )
        assert listed.code != 0 and "secret-plans" not in listed.out, listed
        # All namespaces (a list across tenants): never shows acme's objects.
        everywhere = kubectl.run("bob", "get", "configmaps", "-A", "-o", "name")
        assert "secret-plans" not in everywhere.out, everywhere
        # Deleting it from beta's side touches nothing.
        gone = kubectl.run("bob", "delete", "configmap", "secret-plans")
        assert gone.code != 0, gone
        assert "configmap/secret-plans" in kubectl.names("alice", "cm")
    finally:
        kubectl.run("alice", "delete", "configmap", "secret-plans")


def test_wrong_ca_fails_the_handshake(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    _other_key, other_ca = make_ca("another CA")
    other_file = cluster.tmp / "other-ca.crt"
    other_file.write_bytes(other_ca.public_bytes(serialization.Encoding.PEM))
    config = cluster.tmp / "wrong-ca.kubeconfig"
    config.write_text(kubeconfig(cluster.url, other_file, "alice", USERS["alice"][0], NS))
    result = kubectl.run("alice", "get", "cm", kubeconfig=config)
    assert result.code != 0
    assert "certificate" in result.err and "unknown authority" in result.err, result.err


def test_unknown_token_is_401(kubectl: Kubectl, cluster: ClusterEnv) -> None:
    config = cluster.tmp / "bad-token.kubeconfig"
    config.write_text(kubeconfig(cluster.url, cluster.ca_file, "alice", "no-such-token", NS))
    result = kubectl.run(
        "alice", "get", "--raw", f"/api/v1/namespaces/{NS}/configmaps", kubeconfig=config
    )
    assert result.code != 0
    # kubectl's words for a 401.
    assert "must be logged in" in result.err, result.err

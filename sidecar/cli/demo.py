"""`sidecar demo`: the backing store and the sidecar on free local ports, with the
shipped `policies/`, demo credentials and seed data, until Ctrl-C.

The sidecar serves HTTPS with a certificate for 127.0.0.1/localhost signed by a CA the
demo generates (`Authority`, also used by the tests); each demo user gets a kubeconfig
(the CA, the user's token, one context), and the banner prints `curl` and `kubectl`
lines for them. Everything the demo writes (CA, certificate, kubeconfigs, token file,
config, SQLite files, logs) lives in one temporary directory that is removed when the
demo stops.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import json
import shutil
import signal
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sidecar.cli import launch

# Demo credentials: static tokens (identity.tokenFile). The groups match the
# bindings in the shipped policies/: alice administers acme and owns its nodes,
# dave administers beta, admin is a cluster admin.
DEMO_TOKENS = [
    {"token": "demo-admin", "user": "admin", "tenant": "system", "groups": ["cluster-admins"]},
    {
        "token": "demo-alice",
        "user": "alice",
        "tenant": "acme",
        "groups": ["tenant-admins", "node-owners"],
    },
    {"token": "demo-dave", "user": "dave", "tenant": "beta", "groups": ["tenant-admins"]},
]

SEED: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/api/v1/tenants", {"metadata": {"name": "acme"}}),
    ("POST", "/api/v1/tenants", {"metadata": {"name": "beta"}}),
    (
        "POST",
        "/apis/compute/v1/tenants/acme/namespaces/default/servers",
        {"metadata": {"name": "web-1"}, "tags": ["prod", "web"], "spec": {"flavor": "m1.small"}},
    ),
    (
        "POST",
        "/apis/compute/v1/tenants/acme/namespaces/default/servers",
        {"metadata": {"name": "db-1"}, "tags": ["prod", "db"], "spec": {"flavor": "m1.large"}},
    ),
    (
        "POST",
        "/apis/compute/v1/tenants/beta/namespaces/default/servers",
        {"metadata": {"name": "api-1"}, "tags": ["staging"], "spec": {"flavor": "m1.small"}},
    ),
    (
        "POST",
        "/api/v1/tenants/acme/namespaces/default/configmaps",
        {"metadata": {"name": "settings"}, "data": {"color": "blue"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-a1"}, "spec": {"owner": "acme", "resource_class": "bm-small"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-a2"}, "spec": {"owner": "acme", "resource_class": "bm-large"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-b1"}, "spec": {"owner": "beta", "resource_class": "bm-small"}},
    ),
    (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "node-free"}, "spec": {"owner": None, "resource_class": "bm-small"}},
    ),
]


CLUSTER = "sidecar-demo"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Authority:
    """A certificate authority made on the spot: the demo's, and the tests'."""

    def __init__(self, common_name: str = "sidecar demo CA") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(common_name)
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), serial: int | None = None
    ) -> tuple[bytes, bytes]:
        """A server certificate for `hosts` (IP addresses or DNS names) and its key, PEM."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(hosts[0]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(serial or x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def kubeconfig(server: str, ca_pem: bytes, user: str, token: str, namespace: str | None) -> str:
    """A kubeconfig with one context: `server` trusted through `ca_pem`, `token` as
    the bearer token, and `namespace` as the context's namespace when given."""
    context: dict[str, Any] = {"cluster": CLUSTER, "user": user}
    if namespace:
        context["namespace"] = namespace
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": CLUSTER,
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": f"{user}@{CLUSTER}", "context": context}],
            "current-context": f"{user}@{CLUSTER}",
        },
        sort_keys=False,
    )


def _write_tls(work: Path) -> tuple[Path, Path, Path]:
    """The demo's CA and the sidecar's certificate and key, in `work`."""
    authority = Authority()
    cert, key = authority.issue()
    paths = work / "ca.crt", work / "tls.crt", work / "tls.key"
    for path, data in zip(paths, (authority.cert_pem, cert, key), strict=True):
        path.write_bytes(data)
    paths[2].chmod(0o600)
    return paths


def _write_kubeconfigs(work: Path, base: str, ca_pem: bytes) -> dict[str, Path]:
    """One kubeconfig per demo user; tenant users' contexts name namespace `default`."""
    out: dict[str, Path] = {}
    for entry in DEMO_TOKENS:
        user = str(entry["user"])
        namespace = None if entry["tenant"] == "system" else "default"
        path = work / f"{user}.kubeconfig"
        path.write_text(kubeconfig(base, ca_pem, user, str(entry["token"]), namespace))
        path.chmod(0o600)
        out[user] = path
    return out


# The shipped policies next to the package (a source checkout, `pip install -e .`).
SHIPPED_POLICIES = Path(__file__).resolve().parents[2] / "policies"


def demo_policies(given: str | None) -> Path | None:
    """The policy directory the demo runs with: `--policies`, else `./policies`, else
    the shipped one next to the package (so `sidecar demo` works from any directory);
    None when there is none."""
    if given:
        chosen = Path(given).resolve()
        return chosen if chosen.is_dir() else None
    for candidate in (Path("policies").resolve(), SHIPPED_POLICIES):
        if candidate.is_dir():
            return candidate
    return None


def run(args: argparse.Namespace) -> int:
    policies = demo_policies(args.policies)
    if policies is None:
        where = Path(args.policies or "policies").resolve()
        print(
            f"sidecar demo: no policy directory at {where}; give one with --policies DIR",
            file=sys.stderr,
        )
        return 1
    work = Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    try:
        with launch.ProcessGroup(stop_timeout=15) as procs:  # both stopped however the demo ends
            (work / "tokens.yaml").write_text(yaml.safe_dump(DEMO_TOKENS))
            ca_file, cert_file, key_file = _write_tls(work)
            trust = ssl.create_default_context(cafile=str(ca_file))
            try:
                store = procs.add(
                    launch.start_store(
                        work, work / "store.db", log_path=work / "store.log", timeout=20
                    )
                )
                front = getattr(args, "front", None)
                config: dict[str, Any] = {
                    "tls": {"certFile": str(cert_file), "keyFile": str(key_file)},
                    "upstream": store.url,
                    "policies": str(policies),
                    "identity": {"tokenFile": str(work / "tokens.yaml")},
                    "ledger": f"sqlite:///{work / 'ledger.db'}",
                    "audit": {"path": str(work / "audit.log")},
                }
                if front:  # the decision service behind a front (DESIGN §13), plain HTTP
                    config.pop("tls")
                    authz_port = launch.free_port()
                    config["authz"] = {"listen": f"127.0.0.1:{authz_port}"}
                sidecar = procs.add(
                    launch.start_sidecar(
                        work, config, stem="sidecar", tls=None if front else trust, timeout=20
                    )
                )
                if front:
                    from sidecar.cli.fronts_launch import start_envoy, start_nginx

                    starter = start_envoy if front == "envoy" else start_nginx
                    fronted = procs.add(
                        starter(
                            work,
                            ("127.0.0.1", store.port),
                            ("127.0.0.1", authz_port),
                            ("127.0.0.1", sidecar.port),
                        )
                    )
            except launch.StartError as exc:
                raise SystemExit(f"sidecar demo: {exc}") from None
            base = f"{'http' if front else 'https'}://127.0.0.1:{sidecar.port}"
            for method, path, body in SEED:
                status = _call(base, trust, method, path, body, "demo-admin")
                if status >= 300 and status != 409:
                    print(
                        f"sidecar demo: seeding {method} {path} answered {status}",
                        file=sys.stderr,
                    )
            if front:
                _print_front_banner(front, fronted.url, base, work)
                _wait_for_stop(args.seconds, [store, sidecar, fronted])
                return 0
            kubeconfigs = _write_kubeconfigs(work, base, ca_file.read_bytes())
            operator = _write_operator_contexts(work, base, ca_file)
            _print_banner(base, work, ca_file, kubeconfigs, operator)
            _wait_for_stop(args.seconds, [store, sidecar])
            return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print("demo stopped: backing store and sidecar are down, temporary files removed.")


def _write_operator_contexts(work: Path, base: str, ca_file: Path) -> Path:
    """The operator's kubeconfig with one context per tenant (`sidecar kubeconfig`,
    DESIGN §3) and one acting as alice of acme (`as-user-extra`)."""
    from sidecar.cli.kubeconfig import build

    token = work / "admin.token"
    token.write_text("demo-admin")
    token.chmod(0o600)
    doc = build(
        base,
        str(token),
        ["acme", "beta"],
        ca_file=str(ca_file),
        as_user="alice",
        as_tenant="acme",
        as_groups=["tenant-admins"],
    )
    path = work / "admin-tenants.kubeconfig"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


def _operator_lines(path: Path) -> list[str]:
    k = f"kubectl --kubeconfig {path}"
    return [
        "",
        "# The operator per tenant (docs/operators.md): one context each, whose server URL",
        "# ends in /tenants/{t}, so short paths and -A mean that tenant, never 'default':",
        f"{k} get configmaps -A --context acme",
        f"{k} label configmap web -n default reviewed=yes --context acme",
        f"{k} get servers --context beta",
        "# acting as alice of acme (kubeconfig as-user-extra: {tenant: [acme]}):",
        f"{k} auth whoami --context alice@acme",
        "# write such a kubeconfig for your own operator token:",
        "#   sidecar kubeconfig --server URL --token-file FILE --tenant acme --tenant beta "
        "[--as alice --as-tenant acme]",
    ]


def _print_front_banner(front: str, url: str, proxy: str, work: Path) -> None:
    alice = "curl -s -H 'Authorization: Bearer demo-alice'"
    servers = "/apis/compute/v1/tenants/{t}/namespaces/default/servers"
    lines = [
        "",
        f"sidecar demo: {front} on {url} in front of the store, deciding every request with",
        f"the sidecar's decision service (full proxy on {proxy}; files in {work}). Try:",
        "",
        f"# alice's reads: decided by the sidecar, forwarded by {front} itself (route direct):",
        f"{alice} {url}{servers.format(t='acme')}",
        "# alice's create: the quota needs the full proxy (route proxy):",
        f"{alice} -X POST -H 'Content-Type: application/json' "
        f'-d \'{{"metadata":{{"name":"web-9"}}}}\' {url}{servers.format(t="acme")}',
        "# tenant beta: the proxy's own concealing 404, through the front:",
        f"{alice} {url}{servers.format(t='beta')}",
        "# no credentials: 401; the front's own /healthz needs no decision:",
        f"curl -s {url}/api/v1/nodes",
        f"curl -s {url}/healthz",
        "",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def _print_banner(
    base: str,
    work: Path,
    ca_file: Path,
    kubeconfigs: dict[str, Path],
    operator: Path | None = None,
) -> None:
    curl = f"curl -s --cacert {ca_file}"
    alice = f"{curl} -H 'Authorization: Bearer demo-alice'"
    dave = f"{curl} -H 'Authorization: Bearer demo-dave'"
    admin = f"{curl} -H 'Authorization: Bearer demo-admin'"
    servers = "/apis/compute/v1/tenants/{t}/namespaces/default/servers"
    k_alice, k_dave, k_admin = (
        f"kubectl --kubeconfig {kubeconfigs[user]}" for user in ("alice", "dave", "admin")
    )
    lines = [
        "",
        f"sidecar demo: sidecar on {base} (files in {work}). Try:",
        "",
        "# alice (tenant acme) lists her servers, and those tagged prod:",
        f"{alice} {base}{servers.format(t='acme')}",
        f"{alice} '{base}{servers.format(t='acme')}?tags=prod'",
        "# alice creates a server (counted against acme's quota):",
        f"{alice} -X POST -H 'Content-Type: application/json' "
        f'-d \'{{"metadata":{{"name":"web-2"}},"tags":["new"]}}\' '
        f"{base}{servers.format(t='acme')}",
        "# alice tries tenant beta: 404, exactly as if beta did not exist:",
        f"{alice} {base}{servers.format(t='beta')}",
        "# alice lists nodes: only the ones acme owns (owner rule):",
        f"{alice} {base}/api/v1/nodes",
        "# alice reads acme's quota:",
        f"{alice} {base}/quota/v1/tenants/acme",
        "# dave (tenant beta) with the short path (his own tenant):",
        f"{dave} {base}/apis/compute/v1/namespaces/default/servers",
        "# the cluster admin sees every tenant's servers and every node:",
        f"{admin} {base}/apis/compute/v1/servers",
        f"{admin} {base}/api/v1/nodes",
        f"{admin} {base}/quota/v1/quotas",
        "# no credentials: 401",
        f"{curl} {base}/api/v1/nodes",
        "# readiness needs no credentials; metrics name every tenant (operators only):",
        f"{curl} {base}/readyz",
        f"{admin} {base}/metrics | grep sidecar_requests_total",
        "",
        "# kubectl: one kubeconfig per user (the demo's CA, the user's token, one context).",
        "# Short paths are the caller's own tenant: alice's namespace 'default' is acme's.",
        f"{k_alice} get configmaps",
        f"{k_alice} get servers",
        f"{k_alice} create configmap web --from-literal=color=green",
        "# what alice may do: create configmaps in acme (yes), create tenants (no), all of it:",
        f"{k_alice} auth can-i create configmaps",
        f"{k_alice} auth can-i create tenants",
        f"{k_alice} auth can-i --list",
        f"{k_alice} auth whoami",
        "# dave sees beta's servers only; the cluster admin every node:",
        f"{k_dave} get servers",
        f"{k_admin} get nodes",
        f"{k_admin} auth whoami",
        *(_operator_lines(operator) if operator is not None else []),
        "",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def _wait_for_stop(seconds: float, procs: list[launch.Process]) -> None:
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    deadline = time.monotonic() + seconds if seconds > 0 else None
    while not stop.is_set():
        if deadline is not None and time.monotonic() >= deadline:
            break
        if any(p.proc.poll() is not None for p in procs):
            print("sidecar demo: a process stopped unexpectedly", file=sys.stderr)
            break
        stop.wait(0.2)


def _call(base: str, trust: ssl.SSLContext, method: str, path: str, body: Any, token: str) -> int:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=trust) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code

"""The real `kubectl` against the real sidecar (HTTPS) and the real store (issue 14).

The sidecar serves TLS with a certificate from a CA made here (`cryptography`), runs the
shipped `policies/`, and every user has a kubeconfig with that CA and a static token.
What a new user would try: discovery, get/create/label/delete with label selectors,
`create configmap` (a protobuf body), `--dry-run=server`, a watch, `auth can-i` (yes,
no, `--list`), `auth whoami`, and isolation as before: another tenant's objects stay
404 and never show in lists. A kubeconfig with the wrong CA fails the TLS handshake;
an unknown token is 401.

The tests skip only where kubectl is absent, never under `CI=true`. The cluster (the
`cluster` fixture of tests/system/conftest.py, tests/rigs/cluster.py) is shared with the
Python client's tests (tests/system/test_k8s_client_e2e.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

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

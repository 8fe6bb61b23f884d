"""Hard tenant isolation: unit tests of the stage's rule, the cross-tenant matrix
through the real sidecar app to a recording upstream that counts what it receives, and
against the real backing store (a process): a concealed tenant answers byte for byte
what a tenant that does not exist answers, and short paths land in the caller's own
tenant whatever X-Remote-* headers the client sends. The matrix and the store tests run
in every mode (`tests/rigs/modes.py`): no mode opens another tenant (issue 22)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.core.identity import Identity
from sidecar.core.status import not_found, tenant_not_found
from sidecar.core.target import parse_target
from sidecar.policy.isolation import outside_caller_tenant, refusal
from tests.rigs import modes, processes
from tests.rigs.inprocess import (
    InProcessSidecar,
    RecordingUpstream,
    running_sidecar,
    status_body,
    write_policy,
)
from tests.rigs.processes import write_tokens

ALICE = Identity("alice", "acme", ("users",), "static-token")
OPERATOR = Identity("root", "system", ("operators",), "static-token")

# token → identity, for the two tenants and an operator.
TOKENS = [
    {"token": "acme-user", "user": "alice", "tenant": "acme", "groups": ["users"]},
    {"token": "beta-user", "user": "alice", "tenant": "beta", "groups": ["users"]},
    {"token": "operator", "user": "root", "tenant": "system", "groups": ["operators"]},
]
TOKEN_OF = {"acme": "acme-user", "beta": "beta-user", "system": "operator"}


def target(method: str, path: str, caller: Identity = ALICE) -> Any:
    path, _, query = path.partition("?")
    return parse_target(method, path, query).resolve_tenant(caller.tenant)


# -- the rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "outside"),
    [
        ("/api/v1/tenants/acme/namespaces/dev/pods", False),
        ("/api/v1/namespaces/dev/pods", False),  # short path → the caller's tenant
        ("/api/v1/tenants/acme", False),  # its own Tenant object
        ("/api/v1/tenants/beta/namespaces/dev/pods", True),
        ("/api/v1/tenants/beta", True),
        ("/api/v1/tenants", True),
        ("/api/v1/pods", True),
        ("/api/v1/nodes/n1", True),
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", True),
        ("/version", False),  # non-resource URLs are for authorization
    ],
)
def test_outside_caller_tenant(path: str, outside: bool) -> None:
    assert outside_caller_tenant(ALICE, target("GET", path)) is outside


def test_short_path_of_an_operator_is_the_default_tenant() -> None:
    t = target("GET", "/api/v1/namespaces/dev/pods", OPERATOR)
    assert t.tenant == "default"
    assert outside_caller_tenant(OPERATOR, t)


def test_refusal_bodies() -> None:
    other = target("GET", "/api/v1/tenants/beta/namespaces/dev/pods")
    concealed = refusal(ALICE, other, conceal=True, isolated=True)
    assert concealed.body() == tenant_not_found("beta").body()
    node = target("PUT", "/api/v1/nodes/n1/power")
    for isolated in (True, False):
        # A subresource's 404 is its object's, as the store answers for a missing one.
        got = refusal(ALICE, node, conceal=True, isolated=isolated)
        assert got.body() == not_found("nodes", "n1").body()
    forbidden = refusal(ALICE, other, conceal=False, isolated=True)
    assert forbidden.code == 403
    assert "beta" in forbidden.message


@pytest.mark.parametrize(
    ("who", "path", "isolated", "code"),
    [
        # Its own Tenant object: the caller knows its tenant exists.
        (ALICE, "/api/v1/tenants/acme", False, 403),
        (ALICE, "/api/v1/tenants/acme/status", False, 403),
        # Another tenant's Tenant object: that tenant does not exist for it.
        (ALICE, "/api/v1/tenants/beta", True, 404),
        (ALICE, "/api/v1/tenants/beta", False, 404),
        # A reachable target in another tenant, refused for this verb: 403.
        (ALICE, "/api/v1/tenants/beta/namespaces/dev/pods", False, 403),
        # Operators refused at the cluster level: an honest 403 ...
        (OPERATOR, "/api/v1/nodes/n1", True, 403),
        (OPERATOR, "/api/v1/tenants/beta", True, 403),
        # ... but another tenant's objects are concealed from them like from anyone.
        (OPERATOR, "/api/v1/tenants/beta/namespaces/dev/pods", True, 404),
        # The quota API hides nothing at cluster level, only other tenants.
        (ALICE, "/apis/quota.sidecar/v1/quotas", True, 403),
    ],
)
def test_refusal_status(who: Identity, path: str, isolated: bool, code: int) -> None:
    from sidecar.policy.decide import normalize

    t = normalize(target("GET", path, who), who)
    assert refusal(who, t, conceal=True, isolated=isolated).code == code
    assert refusal(who, t, conceal=False, isolated=isolated).code == 403


@pytest.mark.parametrize(
    ("who", "method", "path", "scope", "tenant", "forwarded"),
    [
        # A tenant user's cluster-level list or watch of a resource stored under
        # tenants means its own tenant (DESIGN §3: `kubectl get -A`) ...
        (ALICE, "GET", "/api/v1/configmaps", "tenant", "acme", "/api/v1/tenants/acme/configmaps"),
        (
            ALICE,
            "GET",
            "/api/v1/pods?watch=1",
            "tenant",
            "acme",
            "/api/v1/tenants/acme/pods?watch=true",
        ),
        (ALICE, "GET", "/api/v1/watch/pods", "tenant", "acme", "/api/v1/watch/tenants/acme/pods"),
        (
            ALICE,
            "GET",
            "/apis/baremetal/v1/allocations",
            "tenant",
            "acme",
            "/apis/baremetal/v1/tenants/acme/allocations",
        ),
        (
            ALICE,
            "GET",
            "/api/v1/secrets?fieldSelector=metadata.name%3Dx",
            "tenant",
            "acme",
            "/api/v1/tenants/acme/secrets?fieldSelector=metadata.name%3Dx",
        ),
        # ... not its other verbs, not cluster-scoped resources, not the Tenant list
        (ALICE, "DELETE", "/api/v1/configmaps", "cluster", None, "/api/v1/configmaps"),
        (ALICE, "GET", "/api/v1/nodes", "cluster", None, "/api/v1/nodes"),
        (ALICE, "GET", "/api/v1/tenants", "cluster", None, "/api/v1/tenants"),
        # ... and a `system` caller keeps the all-tenants meaning.
        (OPERATOR, "GET", "/api/v1/configmaps", "cluster", None, "/api/v1/configmaps"),
    ],
)
def test_cluster_level_lists_of_tenant_users_mean_their_tenant(
    who: Identity, method: str, path: str, scope: str, tenant: str | None, forwarded: str
) -> None:
    from sidecar.policy.decide import normalize

    t = normalize(parse_target(method, path), who)
    assert (t.scope, t.tenant, t.upstream_target()) == (scope, tenant, forwarded)


# -- the matrix through the sidecar ---------------------------------------------------


def matrix(owner: str) -> list[tuple[str, str]]:
    """Every scope and every verb of tenant `owner`'s objects."""
    ns = f"/api/v1/tenants/{owner}/namespaces/dev"
    servers = f"/apis/compute/v1/tenants/{owner}/namespaces/dev/servers"
    return [
        # namespace scope: item verbs, collection verbs, subresources, watch
        ("GET", f"{ns}/pods/p1"),
        ("PUT", f"{ns}/pods/p1"),
        ("PATCH", f"{ns}/pods/p1"),
        ("DELETE", f"{ns}/pods/p1"),
        ("GET", f"{ns}/pods/p1/log"),
        ("GET", f"{ns}/pods"),
        ("GET", f"{ns}/pods?watch=true"),
        ("GET", f"/api/v1/watch/tenants/{owner}/namespaces/dev/pods"),
        ("POST", f"{ns}/pods"),
        ("DELETE", f"{ns}/pods"),
        ("HEAD", f"{ns}/pods/p1"),
        ("GET", f"{servers}/web1/tags"),
        ("PUT", f"{servers}/web1/tags/red"),
        ("DELETE", f"{servers}/web1/tags/red"),
        ("POST", f"/apis/apps/v1/tenants/{owner}/namespaces/dev/deployments"),
        # tenant scope: namespaces and tenant-scoped resources
        ("GET", f"{ns}"),
        ("PUT", f"{ns}"),
        ("PATCH", f"{ns}"),
        ("DELETE", f"{ns}"),
        ("PUT", f"{ns}/status"),
        ("PUT", f"{ns}/finalize"),
        ("GET", f"/api/v1/tenants/{owner}/namespaces"),
        ("POST", f"/api/v1/tenants/{owner}/namespaces"),
        ("DELETE", f"/api/v1/tenants/{owner}/namespaces"),
        ("GET", f"/api/v1/tenants/{owner}/pods"),  # all namespaces of the tenant
        ("GET", f"/apis/baremetal/v1/tenants/{owner}/allocations"),
        ("POST", f"/apis/baremetal/v1/tenants/{owner}/allocations"),
        ("DELETE", f"/apis/baremetal/v1/tenants/{owner}/allocations/a1"),
        # the Tenant object itself
        ("GET", f"/api/v1/tenants/{owner}"),
        ("PUT", f"/api/v1/tenants/{owner}"),
        ("PATCH", f"/api/v1/tenants/{owner}"),
        ("DELETE", f"/api/v1/tenants/{owner}"),
        ("PUT", f"/api/v1/tenants/{owner}/status"),
    ]


CLUSTER_LEVEL = [
    # A tenant user's cluster-level list or watch means its own tenant (DESIGN §3).
    ("GET", "/api/v1/pods", None, None),
    ("GET", "/api/v1/pods?watch=1", None, None),
    ("GET", "/api/v1/watch/pods", None, None),
    ("GET", "/apis/compute/v1/servers", None, None),
    ("DELETE", "/api/v1/pods", "pods", ""),  # deletecollection across tenants
    ("GET", "/api/v1/namespaces", None, None),  # short path: own tenant, allowed
    ("GET", "/api/v1/tenants", "tenants", ""),
    ("POST", "/api/v1/tenants", "tenants", ""),
    ("GET", "/api/v1/nodes", "nodes", ""),
    ("GET", "/api/v1/nodes/n1", "nodes", "n1"),
    ("PUT", "/api/v1/nodes/n1/power", "nodes", "n1"),
    ("DELETE", "/api/v1/persistentvolumes/pv1", "persistentvolumes", "pv1"),
    ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "clusterrolebindings", ""),
]


async def send(
    http: aiohttp.ClientSession, url: str, method: str, path: str, token: str, **kw: Any
) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
    data = b'{"metadata": {"name": "x"}}' if method in ("POST", "PUT", "PATCH") else None
    if data is not None:
        headers["Content-Type"] = "application/json"
    async with http.request(method, url + path, headers=headers, data=data, **kw) as resp:
        return resp.status, await resp.read()


def sidecar_config(tmp: Path, mode: str = "enforce", **extra: Any) -> dict[str, Any]:
    """The config overrides; in `mode` (tenant-dry-run: acme and beta in dry-run)."""
    policies, keys = modes.under(mode, tmp, write_policy(tmp), ("acme", "beta"))
    return {
        "identity.tokenFile": str(write_tokens(tmp, TOKENS)),
        "policies": str(policies),
        **keys,
        **extra,
    }


@pytest.mark.parametrize("mode", modes.MODES)
async def test_cross_tenant_matrix(
    tmp_path: Path,
    recording_upstream: RecordingUpstream,
    inprocess_sidecar: InProcessSidecar,
    mode: str,
) -> None:
    config = sidecar_config(tmp_path, mode)
    async with inprocess_sidecar(recording_upstream.url, config) as url:
        async with aiohttp.ClientSession() as http:
            for owner, intruder in (("acme", "beta"), ("beta", "acme")):
                expected = tenant_not_found(owner).body()
                for method, path in matrix(owner):
                    status, body = await send(http, url, method, path, TOKEN_OF[intruder])
                    assert status == 404, (intruder, method, path, body)
                    if method != "HEAD":
                        assert status_body(body) == expected, (method, path)
            assert recording_upstream.forwarded == [], [
                s.path for s in recording_upstream.forwarded
            ]
            assert recording_upstream.touching("acme") == []
            assert recording_upstream.touching("beta") == []

            # Control: the owner's own users pass isolation for the same requests, and
            # the operator (cluster-wide grant) reaches every tenant.
            for owner in ("acme", "beta", "system"):
                for method, path in matrix("acme" if owner == "system" else owner):
                    if owner != "system" and path.removesuffix("/status").endswith(f"/{owner}"):
                        continue  # the Tenant object is cluster-scoped: policy decides
                    before = len(recording_upstream.forwarded)
                    status, _ = await send(http, url, method, path, TOKEN_OF[owner])
                    assert status == 200, (owner, method, path)
                    # One real request (a charged update is also dry-run and read first).
                    real = [
                        s
                        for s in recording_upstream.forwarded[before:]
                        if s.method == method and "dryRun=All" not in s.path
                    ]
                    assert len(real) == 1, [s.path for s in recording_upstream.forwarded[before:]]
                    assert real[0].one("X-Remote-Tenant") == owner


@pytest.mark.parametrize("mode", modes.MODES)
async def test_cluster_level_targets(
    tmp_path: Path,
    recording_upstream: RecordingUpstream,
    inprocess_sidecar: InProcessSidecar,
    mode: str,
) -> None:
    config = sidecar_config(tmp_path, mode)
    async with inprocess_sidecar(recording_upstream.url, config) as url:
        async with aiohttp.ClientSession() as http:
            for method, path, resource, name in CLUSTER_LEVEL:
                before = len(recording_upstream.forwarded)
                status, body = await send(http, url, method, path, TOKEN_OF["acme"])
                if resource is None:
                    assert status == 200, (method, path, body)
                    assert len(recording_upstream.forwarded) == before + 1
                    assert "/tenants/acme/" in recording_upstream.forwarded[-1].path
                    continue
                assert status == 404, (method, path, body)
                assert name is not None, (method, path, body)
                assert status_body(body) == not_found(resource, name).body()
                assert len(recording_upstream.forwarded) == before
                # The operator's ClusterRoleBinding reaches the cluster level.
                status, _ = await send(http, url, method, path, TOKEN_OF["system"])
                assert status == 200
                assert len(recording_upstream.forwarded) == before + 1


@pytest.mark.parametrize("mode", modes.MODES)
async def test_concealment_off_gives_403(
    tmp_path: Path,
    recording_upstream: RecordingUpstream,
    inprocess_sidecar: InProcessSidecar,
    mode: str,
) -> None:
    config = sidecar_config(tmp_path, mode, concealOtherTenants=False)
    async with inprocess_sidecar(recording_upstream.url, config) as url:
        async with aiohttp.ClientSession() as http:
            for path in (
                "/api/v1/tenants/beta/namespaces/dev/pods",
                "/api/v1/tenants/beta",
                "/api/v1/nodes",
                "/api/v1/persistentvolumes",
            ):
                status, body = await send(http, url, "GET", path, TOKEN_OF["acme"])
                assert status == 403, (path, body)
                assert status_body(body)["reason"] == "Forbidden"
    assert recording_upstream.forwarded == []


@pytest.mark.parametrize(
    "path",
    [
        # Path tricks that try to leave the caller's tenant: all refused as malformed.
        "/api/v1/namespaces/..%2Ftenants%2Fbeta/pods",
        "/api/v1/namespaces/dev%2F..%2F..%2Ftenants%2Fbeta/pods",
        "/api/v1/tenants/acme/../beta/namespaces/dev/pods",
        "/api/v1/tenants/acme/%2E%2E/beta/namespaces/dev/pods",
        "/api/v1/tenants/beta%2Fnamespaces/dev/pods",
        "/api/v1/tenants/BETA/namespaces/dev/pods",
        "/api/v1//tenants/beta/namespaces/dev/pods",
        "/api/v1/namespaces/Dev/pods",
    ],
)
async def test_short_path_tricks_are_refused(
    tmp_path: Path,
    recording_upstream: RecordingUpstream,
    inprocess_sidecar: InProcessSidecar,
    path: str,
) -> None:
    async with inprocess_sidecar(recording_upstream.url, sidecar_config(tmp_path)) as url:
        async with aiohttp.ClientSession() as http:
            status, body = await send(http, url, "GET", path, TOKEN_OF["acme"])
    assert status in (400, 404), (path, body)
    assert status_body(body)["code"] == status
    assert recording_upstream.forwarded == []


async def test_short_path_carries_the_callers_tenant(
    tmp_path: Path,
    recording_upstream: RecordingUpstream,
    inprocess_sidecar: InProcessSidecar,
) -> None:
    spoof = {"X-Remote-Tenant": "beta", "X-Remote-User": "bob"}
    async with inprocess_sidecar(recording_upstream.url, sidecar_config(tmp_path)) as url:
        async with aiohttp.ClientSession() as http:
            for path in (
                "/api/v1/namespaces/dev/pods",
                "/api/v1/watch/namespaces/dev/pods",
                "/api/v1/namespaces/dev/pods?tenant=beta",
            ):
                status, _ = await send(http, url, "GET", path, TOKEN_OF["acme"], headers=spoof)
                assert status == 200
                assert recording_upstream.forwarded[-1].one("X-Remote-Tenant") == "acme"
                assert recording_upstream.forwarded[-1].one("X-Remote-User") == "alice"


# -- against the real backing store (a process) ---------------------------------------


class Client:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def __call__(
        self, who: str, method: str, path: str, body: Any = None, **headers: str
    ) -> tuple[int, bytes]:
        h = {"Authorization": f"Bearer {TOKEN_OF[who]}", **headers}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        async with self.http.request(method, self.url + path, data=data, headers=h) as resp:
            return resp.status, await resp.read()


@pytest.fixture(params=modes.MODES)
async def client(
    tmp_path: Path, store: processes.Proc, request: pytest.FixtureRequest
) -> AsyncIterator[Client]:
    config = sidecar_config(tmp_path, request.param)
    async with running_sidecar(tmp_path, store.url, config) as url:
        async with aiohttp.ClientSession() as http:
            call = Client(http, url)
            for tenant in ("acme", "beta"):
                status, body = await call(
                    "system", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
                )
                assert status == 201, body
            yield call


async def test_concealed_tenant_is_byte_for_byte_a_missing_tenant(client: Client) -> None:
    pairs = [
        ("/api/v1/tenants/beta", "/api/v1/tenants/nosuch"),
        (
            "/api/v1/tenants/beta/namespaces/default/configmaps",
            "/api/v1/tenants/nosuch/namespaces/default/configmaps",
        ),
        ("/api/v1/tenants/beta/namespaces", "/api/v1/tenants/nosuch/namespaces"),
    ]
    for hidden, missing in pairs:
        status_hidden, body_hidden = await client("acme", "GET", hidden)
        # The operator may look anywhere, so this answer comes from the store itself.
        status_missing, body_missing = await client("system", "GET", missing)
        assert status_hidden == status_missing == 404
        assert body_hidden == body_missing.replace(b"nosuch", b"beta")
        # And beta really exists: its own user can read it.
        status, _ = await client("beta", "GET", "/api/v1/tenants/beta/namespaces")
        assert status == 200


async def test_short_path_lands_in_callers_tenant_despite_spoofing(client: Client) -> None:
    spoof = {"X-Remote-Tenant": "beta", "X-Remote-User": "root"}
    status, body = await client(
        "acme",
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "cm1"}},
        **spoof,
    )
    assert status == 201, body
    created = json.loads(body)
    assert created["metadata"]["tenant"] == "acme"
    status, _ = await client(
        "system", "GET", "/api/v1/tenants/acme/namespaces/default/configmaps/cm1"
    )
    assert status == 200
    status, _ = await client(
        "system", "GET", "/api/v1/tenants/beta/namespaces/default/configmaps/cm1"
    )
    assert status == 404
    # beta's user, by short path, sees its own tenant's (empty) namespace only.
    status, body = await client("beta", "GET", "/api/v1/namespaces/default/configmaps")
    assert status == 200
    assert json.loads(body)["items"] == []
    # acme's user lists its own tenant at the cluster level (DESIGN §3), never beta's,
    # and cannot delete beta's tenant.
    status, body = await client("acme", "GET", "/api/v1/configmaps")
    assert status == 200
    assert [i["metadata"]["tenant"] for i in json.loads(body)["items"]] == ["acme"]
    status, _ = await client("acme", "DELETE", "/api/v1/tenants/beta")
    assert status == 404
    status, _ = await client("beta", "GET", "/api/v1/tenants/beta/namespaces/default")
    assert status == 200

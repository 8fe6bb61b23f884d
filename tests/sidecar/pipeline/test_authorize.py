"""The authorize stage in the real sidecar app (in-process, random loopback port) in
front of a small in-process upstream that records what reaches it and answers with
stored nodes whatever their owner (so the sidecar's own filtering is what is tested).
Upstream faults are simulated by that upstream (a 500, a closed port)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.rigs import paths
from tests.rigs.client import BearerClient
from tests.rigs.inprocess import running_sidecar
from tests.rigs.processes import free_port
from tests.rigs.tokens import CASE_TOKENS

CASES_DIR = paths.POLICY_CASES
TOKENS = CASE_TOKENS
NODES = {
    "n1": {"metadata": {"name": "n1"}, "spec": {"owner": "acme"}},
    "n2": {"metadata": {"name": "n2"}, "spec": {"owner": "beta"}},
    "n3": {"metadata": {"name": "n3"}, "spec": {}},
    "n4": {"metadata": {"name": "n4"}, "spec": {"owner": 7}},
    "n5": {"metadata": {"name": "n5"}, "spec": "acme"},
}


class Upstream:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []
        self.gets: dict[str, int] = {}
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = TestServer(app, host="127.0.0.1")

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append((request.method, request.path_qs, body))
        parts = request.path.strip("/").split("/")
        if request.method == "GET" and parts[:3] == ["api", "v1", "nodes"]:
            if len(parts) == 3:
                return web.json_response({"kind": "NodeList", "items": list(NODES.values())})
            self.gets[parts[3]] = self.gets.get(parts[3], 0) + 1
            if parts[3] == "broken":
                return web.json_response({"kind": "Status", "code": 500}, status=500)
            node = NODES.get(parts[3])
            if node is None:
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            return web.json_response(node)
        status = 201 if request.method == "POST" else 200
        return web.json_response({"echo": json.loads(body) if body else None}, status=status)

    def forwarded(self, method: str, prefix: str) -> list[tuple[str, str, bytes]]:
        return [s for s in self.seen if s[0] == method and s[1].startswith(prefix)]


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    await up.server.start_server()
    yield up
    await up.server.close()


def _config(tmp: Path, **extra: Any) -> dict[str, Any]:
    tokens = tmp / "policy-tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKENS))
    return {"identity.tokenFile": str(tokens), "policies": str(CASES_DIR), **extra}


@pytest.fixture
async def client(tmp_path: Path, upstream: Upstream) -> AsyncIterator[BearerClient]:
    url = f"http://127.0.0.1:{upstream.server.port}"
    async with running_sidecar(tmp_path, url, _config(tmp_path)) as side:
        async with aiohttp.ClientSession() as http:
            yield BearerClient(http, side)


async def test_allow_forwards_and_deny_is_403_naming_user_verb_resource(
    client: BearerClient, upstream: Upstream
) -> None:
    status, _ = await client("alice", "GET", "/api/v1/tenants/acme/namespaces/dev/pods")
    assert status == 200
    status, body = await client("alice", "DELETE", "/api/v1/tenants/acme/namespaces/dev/pods/p")
    assert status == 403
    assert body["kind"] == "Status"
    assert body["reason"] == "Forbidden"
    assert body["code"] == 403
    assert 'User "alice"' in body["message"]
    assert "cannot delete" in body["message"]
    assert '"pods"' in body["message"]
    assert "dev" in body["message"]
    assert upstream.forwarded("DELETE", "/api") == []


async def test_non_resource_urls(client: BearerClient) -> None:
    assert (await client("alice", "GET", "/version"))[0] == 200
    status, body = await client("alice", "GET", "/secret-admin")
    assert status == 403
    assert "/secret-admin" in body["message"]


async def test_cluster_scoped_denial_is_404_for_tenants(client: BearerClient) -> None:
    status, body = await client("oscar", "DELETE", "/api/v1/nodes/n1")
    assert status == 404
    assert body["reason"] == "NotFound"
    # The operator gets an honest 403 where policy denies (nothing does here: allowed).
    assert (await client("root", "GET", "/api/v1/nodes/n1"))[0] == 200


async def test_owner_item_access(client: BearerClient, upstream: Upstream) -> None:
    assert (await client("oscar", "GET", "/api/v1/nodes/n1"))[0] == 200
    for name in ("n2", "n3", "n4", "n5", "missing"):
        status, body = await client("oscar", "GET", f"/api/v1/nodes/{name}")
        assert status == 404, name
        assert body["message"] == f'nodes "{name}" not found'
    assert (await client("bea", "GET", "/api/v1/nodes/n2"))[0] == 200
    assert (await client("bea", "GET", "/api/v1/nodes/n1"))[0] == 404
    # n2 reached the upstream three times: acme's and beta's owner reads (caches are
    # per tenant) and beta's forwarded GET; oscar's refused GET was never forwarded.
    assert len([s for s in upstream.seen if s[1] == "/api/v1/nodes/n2"]) == 3


async def test_owner_lookup_is_read_anew_for_every_read(
    client: BearerClient, upstream: Upstream
) -> None:
    for _ in range(3):
        assert (await client("oscar", "GET", "/api/v1/nodes/n2"))[0] == 404
    # The sidecar read n2's owner for each of acme's reads: a read answers with the
    # object as it is now, so the owner behind it is read now too (never cached).
    assert upstream.gets["n2"] == 3
    assert (await client("bea", "GET", "/api/v1/nodes/n2"))[0] == 200
    assert upstream.gets["n2"] == 5  # beta's lookup + the forwarded GET


async def test_owner_lookup_failure_is_503(client: BearerClient) -> None:
    status, body = await client("oscar", "GET", "/api/v1/nodes/broken")
    assert status == 503
    assert body["kind"] == "Status"


async def test_owner_only_list_is_filtered(client: BearerClient, upstream: Upstream) -> None:
    status, body = await client("oscar", "GET", "/api/v1/nodes")
    assert status == 200
    assert [i["metadata"]["name"] for i in body["items"]] == ["n1"]
    assert upstream.forwarded("GET", "/api/v1/nodes?")[-1][1] == "/api/v1/nodes?owner=acme"
    # An unconditional list grant (Ironic's list_all) gets everything, unfiltered.
    status, body = await client("carol", "GET", "/api/v1/nodes")
    assert status == 200
    assert len(body["items"]) == len(NODES)
    assert upstream.seen[-1][1] == "/api/v1/nodes"


async def test_owner_patch_and_power(client: BearerClient, upstream: Upstream) -> None:
    status, body = await client(
        "oscar",
        "PATCH",
        "/api/v1/nodes/n1",
        {"spec": {"resource_class": "gpu"}},
        "application/merge-patch+json",
    )
    assert status == 200
    assert body["echo"] == {"spec": {"resource_class": "gpu"}}
    status, body = await client(
        "oscar",
        "PATCH",
        "/api/v1/nodes/n1",
        {"spec": {"owner": "beta"}},
        "application/merge-patch+json",
    )
    assert status == 403
    assert "spec.owner" in body["message"]
    status, _ = await client(
        "oscar",
        "PATCH",
        "/api/v1/nodes/n1",
        [{"op": "remove", "path": "/spec/owner"}],
        "application/json-patch+json",
    )
    assert status == 403
    assert (await client("oscar", "PUT", "/api/v1/nodes/n1/power", {"target": "power on"}))[
        0
    ] == 200
    assert (await client("oscar", "PUT", "/api/v1/nodes/n2/power", {"target": "power on"}))[
        0
    ] == 404
    assert upstream.forwarded("PUT", "/api/v1/nodes/n2") == []


async def test_restricted_create_defaults_and_checks_owner(
    client: BearerClient, upstream: Upstream
) -> None:
    path = "/apis/baremetal/v1/tenants/acme/allocations"
    status, body = await client("oscar", "POST", path, {"spec": {"resource_class": "gpu"}})
    assert status == 201
    assert body["echo"]["spec"] == {"resource_class": "gpu", "owner": "acme"}
    status, body = await client("oscar", "POST", path, {"spec": {"owner": "beta"}})
    assert status == 403
    assert "owner" in body["message"]
    status, body = await client("oscar", "POST", path, b"{not json")
    assert status == 400
    # An unconditional grant from a TenantRoleBinding may not set another tenant as
    # owner either (DESIGN §5); only a cluster-wide grant may.
    beta = "/apis/baremetal/v1/tenants/beta/allocations"
    status, body = await client("bob", "POST", beta, {"spec": {"owner": "acme"}})
    assert status == 403
    assert "owner" in body["message"]
    status, body = await client("bob", "POST", beta, {"spec": {"resource_class": "gpu"}})
    assert status == 201
    assert body["echo"]["spec"] == {"resource_class": "gpu", "owner": "beta"}
    status, body = await client("root", "POST", beta, {"spec": {"owner": "acme"}})
    assert status == 201
    assert body["echo"]["spec"] == {"owner": "acme"}


async def test_self_subject_access_review(client: BearerClient, upstream: Upstream) -> None:
    before = len(upstream.seen)
    review: dict[str, Any] = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": "dev", "verb": "list", "resource": "pods"}},
    }
    path = "/apis/authorization.k8s.io/v1/tenants/acme/selfsubjectaccessreviews"
    status, body = await client("alice", "POST", path, review)
    assert status == 201
    assert body["kind"] == "SelfSubjectAccessReview"
    assert body["status"]["allowed"] is True
    assert "dev-view" in body["status"]["reason"]
    review["spec"]["resourceAttributes"]["namespace"] = "prod"
    status, body = await client("alice", "POST", path, review)
    assert status == 201
    assert body["status"]["allowed"] is False
    status, body = await client(
        "alice",
        "POST",
        path,
        {"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}},
    )
    assert body["status"]["allowed"] is True
    # Owner rules in a review: the sidecar reads the owner like for a request.
    status, body = await client(
        "oscar",
        "POST",
        path,
        {
            "spec": {
                "resourceAttributes": {
                    "verb": "get",
                    "resource": "nodes",
                    "name": "n2",
                    "scope": "cluster",
                }
            }
        },
    )
    assert status == 201
    assert body["status"]["allowed"] is False
    bad: dict[str, Any]
    for bad in (
        {},
        {"spec": {}},
        {"spec": {"resourceAttributes": {"verb": "get"}}},
        {"spec": {"resourceAttributes": {"verb": "get", "resource": "a/b"}}},
    ):
        assert (await client("alice", "POST", path, bad))[0] == 400, bad
    assert (await client("alice", "POST", path, b"[1"))[0] == 400
    assert [s for s in upstream.seen[before:] if "accessreviews" in s[1]] == []


async def test_subject_access_review(client: BearerClient) -> None:
    path = "/apis/authorization.k8s.io/v1/tenants/acme/subjectaccessreviews"
    review = {
        "spec": {
            "user": "vera",
            "resourceAttributes": {"namespace": "prod", "verb": "get", "resource": "pods"},
        }
    }
    status, body = await client("ada", "POST", path, review)
    assert status == 201
    assert body["kind"] == "SubjectAccessReview"
    assert body["status"]["allowed"] is True
    review["spec"]["user"] = "alice"
    status, body = await client("ada", "POST", path, review)
    assert body["status"]["allowed"] is False
    assert body["status"]["denied"] is True
    # alice may not ask about others.
    status, body = await client("alice", "POST", path, review)
    assert status == 403


async def test_dry_run_forwards_would_deny(tmp_path: Path, upstream: Upstream) -> None:
    url = f"http://127.0.0.1:{upstream.server.port}"
    async with running_sidecar(tmp_path, url, _config(tmp_path, mode="dry-run")) as side:
        async with aiohttp.ClientSession() as http:
            client = BearerClient(http, side)
            path = "/api/v1/tenants/acme/namespaces/dev/pods/p"
            assert (await client("alice", "DELETE", path))[0] == 200
            assert upstream.forwarded("DELETE", path)
            async with http.get(side + "/metrics", headers={"Authorization": "Bearer root"}) as r:
                text = await r.text()
            assert 'sidecar_decisions_total{outcome="would_deny",tenant="acme"} 1.0' in text


async def test_upstream_down_during_owner_fetch_is_503(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with running_sidecar(tmp_path, url, _config(tmp_path)) as side:
        async with aiohttp.ClientSession() as http:
            status, body = await BearerClient(http, side)("oscar", "GET", "/api/v1/nodes/n1")
            assert status == 503
            assert body["kind"] == "Status"


WATCH_ONE = """\
kind: Role
metadata: {name: watch-app-config, tenant: acme, namespace: dev}
rules:
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [app-config]
  verbs: [list, watch]
---
kind: RoleBinding
metadata: {name: watch-app-config, tenant: acme, namespace: dev}
roleRef: {kind: Role, name: watch-app-config}
subjects: [{kind: User, name: alice}]
"""


async def test_field_selector_name_lets_a_resource_names_rule_watch_one_object(
    tmp_path: Path, upstream: Upstream
) -> None:
    """DESIGN §3: a list or watch with `fieldSelector=metadata.name=X` has the name X."""
    policies = tmp_path / "watch-policy"
    policies.mkdir()
    (policies / "p.yaml").write_text(WATCH_ONE)
    url = f"http://127.0.0.1:{upstream.server.port}"
    config = _config(tmp_path, policies=str(policies))
    cms = "/api/v1/tenants/acme/namespaces/dev/configmaps"
    async with running_sidecar(tmp_path, url, config) as side:
        async with aiohttp.ClientSession() as http:
            client = BearerClient(http, side)
            for query, forwarded in (
                ("?fieldSelector=metadata.name%3Dapp-config", None),
                (
                    "?watch=1&fieldSelector=metadata.name%3D%3Dapp-config",
                    "?watch=true&fieldSelector=metadata.name%3D%3Dapp-config",
                ),
                (
                    "?fieldSelector=metadata.namespace%3Ddev,metadata.name%3Dapp-config",
                    "?fieldSelector=metadata.namespace%3Ddev%2Cmetadata.name%3Dapp-config",
                ),
            ):
                assert (await client("alice", "GET", cms + query))[0] == 200, query
                assert upstream.seen[-1][1] == cms + (forwarded or query)
            before = len(upstream.seen)
            for query in (
                "",
                "?watch=1",
                "?fieldSelector=metadata.name%3Dother",
                "?fieldSelector=metadata.name!%3Dapp-config",
                "?fieldSelector=metadata.name=app-config&fieldSelector=metadata.name=x",
            ):
                status, body = await client("alice", "GET", cms + query)
                # A decision parameter given twice is refused before any decision.
                assert status == (400 if query.count("fieldSelector") == 2 else 403), query
                assert body["kind"] == "Status", query
            assert len(upstream.seen) == before

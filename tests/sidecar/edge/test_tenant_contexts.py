"""Tenant contexts (DESIGN §3, issue 29): a server URL ending in `/tenants/{t}`.

The pure reading first (`split_context`, `in_context`), then the real sidecar and the
real store as processes with a recording pass-through in front of the store
(tests/rigs/tenancy.py): short paths, cluster-level lists, discovery and protobuf
bodies through a context land in that tenant; callers outside it get exactly the 404
of a tenant that does not exist, an operator's context of a missing tenant too; a
malformed prefix is 400; and none of those refusals reaches the upstream. An
operator's cluster-wide Table has a TENANT column first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.core.target import Scope, TargetError, parse_target
from sidecar.pipeline.tenant_context import Context, in_context, split_context
from tests.rigs.protobuf import envelope, ld, meta
from tests.rigs.tenancy import Env, running, seed

PB = "application/vnd.kubernetes.protobuf"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"

# -- the pure reading ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/api/v1/namespaces", None),
        ("/tenantsx/acme/api", None),
        ("/healthz", None),
        ("/tenants/acme/api/v1/namespaces/dev/pods?watch=1", Context("acme", "/api/v1/namespaces/dev/pods?watch=1")),
        ("/tenants/acme", Context("acme", "/")),
        ("/%74enants/acme/api", Context("acme", "/api")),  # read as every path is read
        ("/tenants/%61cme/version", Context("acme", "/version")),
    ],
)  # fmt: skip
def test_split_context(raw: str, expected: Context | None) -> None:
    assert split_context(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "/tenants",
        "/tenants/",
        "/tenants/acme/",
        "/tenants//api/v1/namespaces",
        "/tenants/ACME/api",
        "/tenants/a_b/api",
        "/tenants/a%2Fb/api",
        "/tenants/%2e%2e/api",
        "/tenants/..",
        "/tenants/acme//api",
        "/tenants/" + "a" * 64 + "/api",
        "/tenants/%zz/api",
        "/tenants/beta/tenants/acme/api/v1/namespaces",
        "/tenants/beta/%74enants/acme/api",
    ],
)
def test_a_malformed_prefix_is_a_target_error(raw: str) -> None:
    with pytest.raises(TargetError) as caught:
        split_context(raw)
    assert caught.value.code == 400


def test_in_context_puts_short_paths_and_cluster_lists_in_the_tenant() -> None:
    short = in_context(parse_target("GET", "/api/v1/namespaces/dev/configmaps/web"), "acme")
    assert (short.tenant, short.namespace, short.name) == ("acme", "dev", "web")
    assert short.upstream_target() == "/api/v1/tenants/acme/namespaces/dev/configmaps/web"
    listed = in_context(parse_target("GET", "/api/v1/configmaps?limit=5"), "acme")
    assert (listed.scope, listed.tenant) == (Scope.TENANT, "acme")
    assert listed.upstream_target() == "/api/v1/tenants/acme/configmaps?limit=5"
    review = in_context(
        parse_target("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"), "acme"
    )
    assert review.tenant == "acme"
    # Cluster-scoped objects and non-resource URLs are the same in every context.
    for raw in ("/api/v1/nodes", "/api/v1/nodes/n1", "/api/v1/tenants/beta", "/version", "/apis"):
        target = parse_target("GET", raw)
        assert in_context(target, "acme") == target
    # The same tenant named twice is fine; another tenant is a 400.
    same = parse_target("GET", "/api/v1/tenants/acme/namespaces")
    assert in_context(same, "acme") == same
    with pytest.raises(TargetError):
        in_context(parse_target("GET", "/api/v1/tenants/beta/namespaces/ns1/configmaps"), "acme")


# -- the real sidecar ------------------------------------------------------------------------


async def _setup(env: Env) -> None:
    await seed(env, {"n1": "acme"})
    for tenant in ("acme", "beta"):
        status, body = await env.call(
            "admin", "POST", f"/api/v1/tenants/{tenant}/namespaces", {"metadata": {"name": "ns1"}}
        )
        assert status == 201, body
        status, body = await env.call(
            "admin",
            "POST",
            f"/api/v1/tenants/{tenant}/namespaces/ns1/configmaps",
            {"metadata": {"name": "web"}, "data": {"tenant": tenant}},
        )
        assert status == 201, body


async def test_everything_in_a_context_is_that_tenants(tmp_path: Path) -> None:
    async with running(tmp_path) as env:
        await _setup(env)
        # An operator's short path in acme's context reads and writes acme's `web`.
        status, body = await env.call(
            "admin", "GET", "/tenants/acme/api/v1/namespaces/ns1/configmaps/web"
        )
        assert status == 200, body
        assert body["data"] == {"tenant": "acme"}, body
        status, body = await env.call(
            "admin", "PATCH", "/tenants/acme/api/v1/namespaces/ns1/configmaps/web",
            {"metadata": {"labels": {"tier": "front"}}}, "application/merge-patch+json",
        )  # fmt: skip
        assert status == 200, body
        _, acme = await env.call(
            "admin", "GET", "/api/v1/tenants/acme/namespaces/ns1/configmaps/web"
        )
        _, default = await env.call(
            "admin", "GET", "/api/v1/tenants/beta/namespaces/ns1/configmaps/web"
        )
        assert acme["metadata"]["labels"] == {"tier": "front"}
        assert "labels" not in default["metadata"]
        assert env.upstream_saw("/api/v1/tenants/acme/namespaces/ns1/configmaps/web")
        assert not env.upstream_saw("/tenants/default/")
        # `kubectl get cm -A` in the context: that tenant's namespaces only.
        status, body = await env.call("admin", "GET", "/tenants/beta/api/v1/configmaps")
        assert status == 200, body
        assert [i["data"] for i in body["items"]] == [{"tenant": "beta"}]
        # Cluster-scoped objects stay what they are.
        status, body = await env.call("admin", "GET", "/tenants/beta/api/v1/nodes/n1")
        assert status == 200, body
        # Discovery, served and forwarded.
        status, body = await env.call("admin", "GET", "/tenants/acme/api")
        assert status == 200, body
        assert body["kind"] == "APIVersions", body
        status, body = await env.call("admin", "GET", "/tenants/acme/apis/authorization.k8s.io/v1")
        assert status == 200, body
        assert body["kind"] == "APIResourceList", body
        # A protobuf body (kubectl create configmap) lands in the context's tenant.
        pb = envelope("v1", "ConfigMap", meta(ld(1, "from-pb")))
        status, body = await env.call_raw(
            "admin", "POST", "/tenants/acme/api/v1/namespaces/ns1/configmaps", pb, PB
        )
        assert status == 201, body
        status, _ = await env.call(
            "admin", "GET", "/api/v1/tenants/acme/namespaces/ns1/configmaps/from-pb"
        )
        assert status == 200
        # A tenant's own user may use its own tenant's context.
        status, body = await env.call(
            "acme-admin", "GET", "/tenants/acme/api/v1/namespaces/ns1/configmaps"
        )
        assert status == 200, body
        assert len(body["items"]) == 2, body
        # An access review in the context is about that tenant.
        review = {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "spec": {"resourceAttributes": {"verb": "*", "resource": "*", "namespace": "ns1"}},
        }
        for token in ("admin", "acme-admin"):
            status, body = await env.call(
                token,
                "POST",
                "/tenants/acme/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                review,
            )
            assert status == 201, (token, body)
            assert body["status"]["allowed"] is True, (token, body)
        status, body = await env.call(
            "acme-dev",
            "POST",
            "/tenants/acme/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            review,
        )
        assert status == 201, body
        assert body["status"]["allowed"] is False, body
        assert "*" in body["status"]["reason"]
        assert "\x00" not in body["status"]["reason"]


async def test_callers_outside_the_tenant_get_the_missing_tenant_404(tmp_path: Path) -> None:
    async with running(tmp_path) as env:
        await _setup(env)
        # What a tenant that does not exist answers (the store's own 404, as the admin).
        status, missing = await env.call(
            "admin", "GET", "/api/v1/tenants/nosuch/namespaces/ns1/configmaps"
        )
        assert status == 404, missing
        before = len(env.recorder.seen)
        for token, path in (
            ("beta-admin", "/tenants/acme/api/v1/namespaces/ns1/configmaps"),
            ("beta-admin", "/tenants/acme/api"),
            ("beta-admin", "/tenants/acme/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
            ("acme-owner", "/tenants/beta/api/v1/nodes"),
            ("admin", "/tenants/nosuch/api/v1/namespaces/ns1/configmaps"),
            ("admin", "/tenants/nosuch/version"),
        ):
            tenant = path.split("/")[2]
            status, body = await env.call(token, "GET", path)
            assert status == 404, (token, path, body)
            expected = {**missing, "message": missing["message"].replace("nosuch", tenant)}
            expected["details"] = {**missing["details"], "name": tenant}
            assert body == expected, (token, path)
        # The only upstream calls: the operator's existence checks of `nosuch`.
        assert {p for _, p in env.recorder.seen[before:]} <= {"/api/v1/tenants/nosuch"}


async def test_a_malformed_prefix_is_400_and_nothing_is_forwarded(tmp_path: Path) -> None:
    async with running(tmp_path) as env:
        await _setup(env)
        before = len(env.recorder.seen)
        for path in (
            "/tenants",
            "/tenants/",
            "/tenants//api/v1/namespaces",
            "/tenants/ACME/api/v1/namespaces",
            "/tenants/a_b/api",
            "/tenants/%2e%2e/api/v1/nodes",
            "/tenants/acme//api",
            "/tenants/acme/api/v1/tenants/beta/namespaces/ns1/configmaps",
        ):
            for token in ("admin", "acme-admin"):
                status, body = await env.call(token, "GET", path)
                assert status == 400, (path, body)
                assert body["kind"] == "Status", body
                assert body["reason"] == "BadRequest", body
        assert env.recorder.seen[before:] == []


async def test_an_operators_cluster_wide_table_names_the_tenant_first(tmp_path: Path) -> None:
    async with running(tmp_path) as env:
        await _setup(env)

        async def table(path: str) -> Any:
            headers = {"Authorization": "Bearer admin", "Accept": TABLE}
            async with env.http.get(env.url + path, headers=headers) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        doc = await table("/api/v1/configmaps")
        assert doc["columnDefinitions"][0]["name"] == "Tenant"
        assert sorted(row["cells"][0] for row in doc["rows"]) == ["acme", "beta"]
        # One tenant's list (a context, or a tenant path) needs no such column.
        for path in ("/tenants/acme/api/v1/configmaps", "/api/v1/tenants/acme/configmaps"):
            doc = await table(path)
            assert doc["columnDefinitions"][0]["name"] == "Name", path
        # Nor does a cluster-scoped resource.
        doc = await table("/api/v1/nodes")
        assert doc["columnDefinitions"][0]["name"] == "Name"

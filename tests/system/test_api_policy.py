"""Tenants manage their own access (issue 30, DESIGN §5 "Policy objects through the
API"), against the real store and two real sidecars on it: a tenant admin's Role and
RoleBinding grant, on both sidecars, within 2 s; deleting revokes and ends an open
watch; escalation, malformed objects and other tenants are refused and nothing is
stored; a TenantRoleBinding to cluster-admin stays inside its tenant; a restart keeps
everything; a broken object planted in the store is skipped and shown in /readyz; a
namespace ResourceQuota lowers the limit, never raises it, exactly across sidecars."""

from __future__ import annotations

import asyncio
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.rigs import processes
from tests.rigs.apipolicy import (
    RBAC,
    ApiPolicyEnv,
    binding,
    ns_path,
    role,
    seed,
    start,
)
from tests.rigs.paths import SHIPPED_POLICIES
from tests.rigs.waiting import eventually

IN_FORCE_WITHIN = 2.0  # DESIGN §11: in force on every replica within 2 s
CM_READER = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPolicyEnv]:
    tmp = tmp_path_factory.mktemp("apipolicy")
    procs = processes.Processes(tmp)
    try:
        started = start(tmp, procs)
        asyncio.run(seed(started))
        yield started
    finally:
        procs.stop_all()


async def status_of(env: ApiPolicyEnv, token: str, path: str, via: int = 0) -> int:
    status, _ = await env.call(token, "GET", path, via=via)
    return status


async def test_a_tenant_admins_grant_is_in_force_on_every_sidecar_and_delete_revokes(
    env: ApiPolicyEnv,
) -> None:
    cms = "/api/v1/tenants/acme/namespaces/dev/configmaps"
    other_ns = "/api/v1/tenants/acme/namespaces/prod/configmaps"
    assert await status_of(env, "amy", cms) == 403
    status, _ = await env.call(
        "alice", "POST", ns_path("acme", "dev", "roles"), role("r1", CM_READER)
    )
    assert status == 201
    status, _ = await env.call(
        "alice",
        "POST",
        ns_path("acme", "dev", "rolebindings"),
        binding("amy-reads", "Role", "r1", "amy"),
    )
    assert status == 201
    for via in (0, 1):  # sidecar 1 never saw the write
        await eventually(
            functools.partial(_is, env, "amy", cms, 200, via), IN_FORCE_WITHIN, f"grant on {via}"
        )
    assert await status_of(env, "amy", other_ns) == 403  # another namespace: unaffected
    assert await status_of(env, "ben", cms) == 403  # another user: unaffected
    # The grant names its origin in the access review's reason.
    status, review = await env.call(
        "amy",
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "spec": {
                "resourceAttributes": {"namespace": "dev", "verb": "list", "resource": "configmaps"}
            },
        },
    )
    assert status == 201
    assert review["status"]["allowed"] is True
    assert "rolebinding acme/dev/amy-reads" in review["status"]["reason"]
    # `kubectl auth can-i --list` (a rules review) lists the API grant.
    status, rules = await env.call(
        "amy",
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        {
            "kind": "SelfSubjectRulesReview",
            "apiVersion": "authorization.k8s.io/v1",
            "spec": {"namespace": "dev"},
        },
    )
    assert status == 201, rules
    assert any("configmaps" in r["resources"] for r in rules["status"]["resourceRules"])
    # The revision covers both sources, on every sidecar alike.
    revisions = [(await env.ready(via))["checks"]["policy"]["detail"].split()[1] for via in (0, 1)]
    assert revisions[0] == revisions[1]
    assert "+" in revisions[0]

    # An open watch ends when the binding goes, on the other sidecar too.
    async with aiohttp.ClientSession() as session:
        watch = await session.get(
            env.sidecars[1].url + cms + "?watch=true", headers={"Authorization": "Bearer amy"}
        )
        assert watch.status == 200
        status, _ = await env.call(
            "alice", "DELETE", ns_path("acme", "dev", "rolebindings") + "/amy-reads"
        )
        assert status == 200
        await asyncio.wait_for(watch.content.read(), 10)  # hang guard only
        watch.release()
    for via in (0, 1):
        await eventually(
            functools.partial(_is, env, "amy", cms, 403, via), IN_FORCE_WITHIN, f"revoke on {via}"
        )


async def _is(env: ApiPolicyEnv, token: str, path: str, want: int, via: int) -> bool:
    return await status_of(env, token, path, via) == want


async def test_escalation_is_refused_for_roles_and_bindings(env: ApiPolicyEnv) -> None:
    # ben may write roles and rolebindings in acme/dev (not escalate, not bind), and
    # read configmaps there.
    writer = role(
        "rbac-writer",
        [
            {
                "apiGroups": ["rbac.authorization.k8s.io"],
                "resources": ["roles", "rolebindings"],
                "verbs": ["get", "list", "create", "update", "patch", "delete"],
            },
            *CM_READER,
        ],
    )
    assert (await env.call("alice", "POST", ns_path("acme", "dev", "roles"), writer))[0] == 201
    status, _ = await env.call(
        "alice",
        "POST",
        ns_path("acme", "dev", "rolebindings"),
        binding("ben-writes", "Role", "rbac-writer", "ben"),
    )
    assert status == 201
    roles = ns_path("acme", "dev", "roles")
    await eventually(lambda: _is(env, "ben", roles, 200, 0), IN_FORCE_WITHIN, "ben's grant")

    secrets = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    status, body = await env.call("ben", "POST", roles, role("sneaky", secrets))
    assert status == 403
    assert body["reason"] == "Forbidden"
    assert "secrets" in body["message"]
    assert "not currently held" in body["message"]
    assert (await env.store_call("GET", roles + "/sneaky"))[0] == 404
    # Within what ben holds: allowed; then a patch adding secrets: refused.
    ok = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
    assert (await env.call("ben", "POST", roles, role("ben-own", ok)))[0] == 201
    status, body = await env.call(
        "ben",
        "PATCH",
        roles + "/ben-own",
        [{"op": "add", "path": "/rules/0/resources/-", "value": "secrets"}],
        content_type="application/json-patch+json",
    )
    assert status == 403, body
    _, stored = await env.store_call("GET", roles + "/ben-own")
    assert stored["rules"][0]["resources"] == ["configmaps"]
    # Binding a role ben does not hold: refused; binding one he holds: allowed.
    bindings = ns_path("acme", "dev", "rolebindings")
    status, body = await env.call(
        "ben", "POST", bindings, binding("ben-admin", "ClusterRole", "tenant-admin", "ben")
    )
    assert status == 403
    assert "not currently held" in body["message"]
    status, body = await env.call(
        "ben", "POST", bindings, binding("ben-missing", "Role", "no-such-role", "ben")
    )
    assert status == 403
    assert "does not exist" in body["message"]
    status, _ = await env.call(
        "ben", "POST", bindings, binding("amy-own", "Role", "ben-own", "amy")
    )
    assert status == 201


async def test_malformed_objects_are_refused_naming_the_field_and_not_stored(
    env: ApiPolicyEnv,
) -> None:
    roles = ns_path("acme", "dev", "roles")
    bindings = ns_path("acme", "dev", "rolebindings")
    cases = [
        (
            roles,
            role("bad-verb", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "fly"]}]),
            "rules[0].verbs[1]",
        ),
        (roles, role("no-verbs", [{"apiGroups": [""], "resources": ["pods"]}]), "rules[0]"),
        (roles, {**role("extra", CM_READER), "spec": {}}, "spec"),
        (
            bindings,
            {
                **binding("cross", "Role", "r1"),
                "subjects": [{"kind": "User", "name": "bert", "tenant": "beta"}],
            },
            "subjects[0].tenant",
        ),
        (
            f"{RBAC}/tenants/acme/tenantrolebindings",
            binding("wrong-ref", "Role", "r1", "amy"),
            "roleRef.kind",
        ),
        (
            "/api/v1/tenants/acme/namespaces/dev/resourcequotas",
            {"metadata": {"name": "q-bad"}, "spec": {"hard": {"servers": "-1"}}},
            "spec.hard.servers",
        ),
    ]
    for path, body, field in cases:
        status, answer = await env.call("alice", "POST", path, body)
        assert status == 422, (field, answer)
        assert answer["reason"] == "Invalid"
        assert field in [c["field"] for c in answer["details"]["causes"]], answer
        name = body["metadata"]["name"]
        assert (await env.store_call("GET", f"{path}/{name}"))[0] == 404, f"{name} was stored"


async def test_a_tenant_role_binding_to_cluster_admin_stays_inside_its_tenant(
    env: ApiPolicyEnv,
) -> None:
    status, _ = await env.call(
        "alice",
        "POST",
        f"{RBAC}/tenants/acme/tenantrolebindings",
        binding("amy-ca", "ClusterRole", "cluster-admin", "amy"),
    )
    assert status == 201
    secrets = "/api/v1/tenants/acme/namespaces/prod/secrets"
    await eventually(lambda: _is(env, "amy", secrets, 200, 1), IN_FORCE_WITHIN, "tenant grant")
    assert await status_of(env, "amy", "/api/v1/tenants/beta/namespaces/dev/secrets") == 404
    assert await status_of(env, "amy", "/api/v1/nodes") == 404
    assert await status_of(env, "amy", "/api/v1/tenants") == 404
    assert await status_of(env, "amy", "/quota/v1/quotas") == 403
    assert await status_of(env, "amy", "/metrics") == 403  # its non-resource URLs: no
    # Even the referenced role's rules do not reach the quota API: amy cannot raise it.
    status, _ = await env.call(
        "amy", "PUT", "/quota/v1/tenants/acme/servers", {"hard_limit": 100000}
    )
    assert status == 403
    status, _ = await env.call("alice", "DELETE", f"{RBAC}/tenants/acme/tenantrolebindings/amy-ca")
    assert status == 200


async def test_another_tenant_cannot_see_or_write_them(env: ApiPolicyEnv) -> None:
    for method, path, body in [
        ("POST", ns_path("acme", "dev", "rolebindings"), binding("bert-in", "Role", "r1", "bert")),
        ("GET", ns_path("acme", "dev", "rolebindings"), None),
        ("POST", f"{RBAC}/tenants/acme/tenantroles", role("t", CM_READER)),
        ("POST", "/api/v1/tenants/acme/namespaces/dev/resourcequotas", {"metadata": {"name": "q"}}),
    ]:
        status, _ = await env.call("bert", method, path, body)
        assert status == 404, (method, path)
    assert (await env.store_call("GET", ns_path("acme", "dev", "rolebindings") + "/bert-in"))[
        0
    ] == 404


async def test_a_restart_keeps_the_grants_and_a_broken_stored_object_is_skipped(
    env: ApiPolicyEnv,
) -> None:
    roles = ns_path("acme", "prod", "roles")
    bindings = ns_path("acme", "prod", "rolebindings")
    assert (await env.call("alice", "POST", roles, role("prod-reader", CM_READER)))[0] == 201
    status, _ = await env.call(
        "alice", "POST", bindings, binding("ben-prod", "Role", "prod-reader", "ben")
    )
    assert status == 201
    # Planted straight in the store (as written before this change): a binding naming a
    # subject of another tenant. It grants nothing and blocks nothing.
    planted = {
        **binding("planted", "Role", "prod-reader"),
        "subjects": [{"kind": "User", "name": "bert", "tenant": "beta"}],
    }
    assert (await env.store_call("POST", bindings, planted))[0] == 201
    env.restart(1)
    cms = "/api/v1/tenants/acme/namespaces/prod/configmaps"
    await eventually(lambda: _is(env, "ben", cms, 200, 1), IN_FORCE_WITHIN, "kept after restart")
    ready = await env.ready(1)
    assert ready["status"] == 200
    detail = ready["checks"]["apiPolicy"]["detail"]
    assert "skipped as broken" in detail
    assert "acme" not in detail
    assert await status_of(env, "bert", "/api/v1/tenants/acme/namespaces/prod/configmaps", 1) == 404


async def test_a_namespace_resource_quota_lowers_and_never_raises(env: ApiPolicyEnv) -> None:
    servers = "/apis/compute/v1/tenants/beta/namespaces/dev/servers"
    quotas = "/api/v1/tenants/beta/namespaces/dev/resourcequotas"
    status, _ = await env.call(
        "bert", "POST", quotas, {"metadata": {"name": "q1"}, "spec": {"hard": {"servers": "3"}}}
    )
    assert status == 201

    async def limit_seen(via: int) -> bool:
        _, shown = await env.call("bert", "GET", "/quota/v1/tenants/beta/namespaces/dev", via=via)
        return any(
            q["resource"] == "servers" and q["hard_limit"] == 3 and q["source"] == "object"
            for q in shown["quotas"]
        )

    for via in (0, 1):
        await eventually(functools.partial(limit_seen, via), IN_FORCE_WITHIN, f"quota on {via}")
    # Concurrent creates through both sidecars: exactly 3 succeed.
    results = await asyncio.gather(
        *(
            env.call(
                "bert", "POST", servers, {"metadata": {"name": f"s{i}"}, "spec": {}}, via=i % 2
            )
            for i in range(8)
        )
    )
    assert sorted(s for s, _ in results).count(201) == 3
    refused = [b for s, b in results if s == 403]
    assert refused
    assert all(b["reason"] == "QuotaExceeded" for b in refused), refused
    # Raising the namespace quota above the tenant's (beta: shipped tenant limit) never
    # lets the namespace pass the tenant's limit.
    _, tenant = await env.call("bert", "GET", "/quota/v1/tenants/beta")
    tenant_servers = next(q for q in tenant["quotas"] if q["resource"] == "servers")
    hard = int(tenant_servers["hard_limit"])
    status, _ = await env.call(
        "bert",
        "PUT",
        quotas + "/q1",
        {"metadata": {"name": "q1"}, "spec": {"hard": {"servers": str(hard * 10)}}},
    )
    assert status == 200
    status, _ = await env.call("admin", "PUT", "/quota/v1/tenants/beta/servers", {"hard_limit": 4})
    assert status == 200
    await eventually(
        lambda: _created(env, servers, "after-raise", 201), IN_FORCE_WITHIN, "room up to 4"
    )
    status, body = await env.call(
        "bert", "POST", servers, {"metadata": {"name": "over"}, "spec": {}}, via=1
    )
    assert status == 403, body  # the tenant's 4, whatever the namespace quota says


async def _created(env: ApiPolicyEnv, path: str, name: str, want: int) -> bool:
    status, _ = await env.call("bert", "POST", path, {"metadata": {"name": name}, "spec": {}})
    return status == want


async def test_a_store_that_cannot_be_read_keeps_the_last_loaded_set(
    tmp_path: Path, procs: processes.Processes
) -> None:
    one = start(tmp_path, procs, sidecars=1)
    await seed(one)
    assert (await one.call("alice", "POST", ns_path("acme", "dev", "roles"), role("r", CM_READER)))[
        0
    ] == 201
    status, _ = await one.call(
        "alice", "POST", ns_path("acme", "dev", "rolebindings"), binding("b", "Role", "r", "amy")
    )
    assert status == 201
    review = {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "spec": {
            "resourceAttributes": {"namespace": "dev", "verb": "list", "resource": "configmaps"}
        },
    }

    async def allowed() -> bool:
        status, answer = await one.call(
            "amy", "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review
        )
        assert status == 201, answer
        return bool(answer["status"]["allowed"])

    await eventually(allowed, IN_FORCE_WITHIN, "the grant")
    port = one.store.port
    one.store.stop()

    async def says_unreadable() -> bool:
        detail = (await one.ready())["checks"]["apiPolicy"]["detail"]
        return "cannot be read" in detail and "last loaded set stays in force" in detail

    await eventually(says_unreadable, 10, "/readyz names the unreadable store")
    assert await allowed()  # the last loaded set stays in force
    one.store = procs.store(db=tmp_path / "store.db", port=port)

    async def recovered() -> bool:
        return "cannot be read" not in (await one.ready())["checks"]["apiPolicy"]["detail"]

    await eventually(recovered, 10, "following the store again")
    assert await allowed()


async def test_a_bindings_role_ref_is_immutable(env: ApiPolicyEnv) -> None:
    bindings = ns_path("beta", "prod", "rolebindings")
    roles = ns_path("beta", "prod", "roles")
    assert (await env.call("bert", "POST", roles, role("a", CM_READER)))[0] == 201
    assert (await env.call("bert", "POST", roles, role("b", CM_READER)))[0] == 201
    status, _ = await env.call("bert", "POST", bindings, binding("x", "Role", "a"))
    assert status == 422  # no subjects
    body = {**binding("x", "Role", "a"), "subjects": [{"kind": "Group", "name": "g"}]}
    assert (await env.call("bert", "POST", bindings, body))[0] == 201
    moved = {**body, "roleRef": {**body["roleRef"], "name": "b"}}
    status, answer = await env.call("bert", "PUT", bindings + "/x", moved)
    assert status == 422, answer
    assert [c["field"] for c in answer["details"]["causes"]] == ["roleRef"]
    status, answer = await env.call(
        "bert",
        "PATCH",
        bindings + "/x",
        {"roleRef": {"name": "b"}},
        content_type="application/merge-patch+json",
    )
    assert status == 422, answer
    _, stored = await env.store_call("GET", bindings + "/x")
    assert stored["roleRef"]["name"] == "a"
    status, _ = await env.call(
        "bert", "PUT", bindings + "/x", {**body, "subjects": [{"kind": "Group", "name": "h"}]}
    )
    assert status == 200


async def test_a_file_reload_keeps_the_api_grants(
    tmp_path: Path, procs: processes.Processes
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, policies)
    one = start(tmp_path, procs, sidecars=0)
    config = {**_config_of(tmp_path, one), "policies": str(policies)}
    one.configs.append(config)
    one.sidecars.append(procs.sidecar(config, name="reloading"))
    await seed(one)
    cms = "/api/v1/tenants/acme/namespaces/dev/configmaps"
    assert (await one.call("alice", "POST", ns_path("acme", "dev", "roles"), role("r", CM_READER)))[
        0
    ] == 201
    status, _ = await one.call(
        "alice", "POST", ns_path("acme", "dev", "rolebindings"), binding("b", "Role", "r", "amy")
    )
    assert status == 201
    await eventually(functools.partial(_is, one, "amy", cms, 200, 0), IN_FORCE_WITHIN, "grant")
    before = (await one.ready())["checks"]["policy"]["detail"].split()[1]
    with (policies / "99-extra.yaml").open("w") as f:
        f.write("kind: ClusterRole\nmetadata: {name: extra}\nrules: []\n")

    async def reloaded() -> str | None:
        now = str((await one.ready())["checks"]["policy"]["detail"].split()[1])
        return now if now.split("+")[0] != before.split("+")[0] else None

    after = await eventually(reloaded, 10, "the file reload")
    assert after.split("+")[1] == before.split("+")[1]  # the same API objects
    assert await status_of(one, "amy", cms) == 200


def _config_of(tmp: Path, env: ApiPolicyEnv) -> dict[str, object]:
    return {
        "upstream": env.store.url,
        "identity": {"tokenFile": str(tmp / "tokens.yaml")},
        "ledger": f"sqlite:///{tmp / 'ledger.db'}",
        "audit": {"path": str(tmp / "audit-reloading.log")},
        "apiPolicy": {"retrySeconds": 0.2},
    }

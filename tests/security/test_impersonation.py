"""Impersonation (issue 22, item 1; DESIGN §4): `Impersonate-*` headers are decided,
never passed through.

Before: the sidecar neither decided nor stripped them. `Impersonate-User: admin` from a
developer was answered as the developer, and the headers reached the upstream beside
the sidecar's `X-Remote-User`, so an upstream that honours them acted as someone the
sidecar never decided on. Now: the caller must be allowed verb `impersonate` on each
attribute in the impersonated tenant; allowed, every later stage (authorization,
reviews, the audit line, the identity sent upstream) sees the impersonated identity,
while the tenant rate limit charges the caller's tenant; refused → 403 naming the
attribute, malformed → 400; no `Impersonate-*` header (nor an `identity.stripHeaders`
one) ever reaches the upstream.

The real store and the real sidecar as processes, the shipped policies; a recording
pass-through in front of the store shows what the upstream received.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

from tests.rigs import processes
from tests.rigs.tenancy import SHIPPED_POLICIES, TOKENS, Env, Recorder, running
from tests.rigs.waiting import eventually

Headers = Sequence[tuple[str, str]]
AS_DAVE = (("Impersonate-User", "dave"), ("Impersonate-Group", "developers"))
DEV = "/api/v1/tenants/acme/namespaces/dev"
STRIPPED = ["X-Auth-Request-User", "X-Forwarded-User"]
# Hang guard only.
WITHIN = 10.0


async def call(
    env: Env,
    token: str,
    method: str,
    path: str,
    headers: Headers = (),
    body: Any = None,
    request_id: str = "",
) -> tuple[int, Any]:
    """One request as `token` with extra `headers` (repeatable names kept)."""
    sent = CIMultiDict([("Authorization", f"Bearer {token}"), *headers])
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    if request_id:
        sent["X-Request-Id"] = request_id
    url = URL(env.url + path, encoded=True)
    async with env.http.request(method, url, data=data, headers=sent) as resp:
        raw = await resp.read()
    try:
        return resp.status, json.loads(raw) if raw else None
    except ValueError:
        return resp.status, raw


async def seed(env: Env) -> None:
    for tenant in ("acme", "beta"):
        status, body = await call(
            env, "admin", "POST", "/api/v1/tenants", body={"metadata": {"name": tenant}}
        )
        assert status == 201, body
    status, body = await call(
        env, "admin", "POST", "/api/v1/tenants/acme/namespaces", body={"metadata": {"name": "dev"}}
    )
    assert status == 201, body


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with running(tmp_path) as e:
        await seed(e)
        yield e


@pytest.fixture
async def stripping(tmp_path: Path) -> AsyncIterator[Env]:
    identity = {"tokenFile": str(tmp_path / "tokens.yaml"), "stripHeaders": STRIPPED}
    async with running(tmp_path, identity=identity) as e:
        await seed(e)
        yield e


def audit_records(env: Env) -> list[dict[str, Any]]:
    path = env.sidecar.extra["config"].parent / f"sidecar-{env.sidecar.port}-audit.log"
    try:
        return [json.loads(line) for line in path.read_text().splitlines()]
    except FileNotFoundError:
        return []


async def audit_record(env: Env, request_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for record in audit_records(env):
            if record.get("requestId") == request_id:
                return record
        return None

    return await eventually(found, WITHIN, what=f"the audit record of {request_id}")


def upstream_headers(env: Env, fragment: str) -> list[list[tuple[str, str]]]:
    """The headers of every request the upstream received whose path holds `fragment`."""
    recorder = env.recorder
    return [
        h for (_, path), h in zip(recorder.seen, recorder.headers, strict=True) if fragment in path
    ]


# -- allowed: the impersonated identity's answers --------------------------------------


async def test_a_tenant_admin_as_a_developer_gets_exactly_the_developers_answers(
    env: Env,
) -> None:
    """alice administers acme; as dave of the developers she gets what dave's own token
    gets, refusals included, and nothing of her own rights."""
    asks: list[tuple[str, str, Any]] = [
        ("GET", f"{DEV}/pods", None),
        ("GET", "/api/v1/namespaces/dev/pods", None),  # a short path: dave's tenant
        ("GET", "/api/v1/tenants/acme/namespaces/prod/pods", None),  # alice may, dave not
        ("DELETE", "/api/v1/tenants/acme/namespaces/prod/configmaps/x", None),
        ("GET", "/api/v1/nodes", None),
        ("GET", "/api/v1/tenants/beta/namespaces", None),
        (
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {
                "spec": {
                    "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "prod"}
                }
            },
        ),
        ("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {}),
    ]
    for method, path, body in asks:
        own = await call(env, "acme-dev", method, path, body=body)
        acted = await call(env, "acme-admin", method, path, AS_DAVE, body=body)
        assert acted == own, (method, path, own, acted)
    # The same requests as alice herself are answered otherwise.
    status, _ = await call(env, "acme-admin", "GET", "/api/v1/tenants/acme/namespaces/prod/pods")
    assert status == 200
    status, who = await call(
        env, "acme-admin", "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", AS_DAVE,
        body={},
    )  # fmt: skip
    assert status == 201
    assert who["status"]["userInfo"]["username"] == "dave"
    assert who["status"]["userInfo"]["extra"] == {"tenant": ["acme"]}


async def test_the_upstream_sees_the_impersonated_identity_and_no_impersonation_header(
    env: Env,
) -> None:
    status, body = await call(
        env,
        "acme-admin",
        "POST",
        "/api/v1/namespaces/dev/configmaps",  # short path: resolved to dave's tenant
        [*AS_DAVE, ("Impersonate-Uid", "1001"), ("Impersonate-Extra-Scopes", "x")],
        body={"metadata": {"name": "made-as-dave"}},
    )
    assert status == 201, body
    received = upstream_headers(env, "/tenants/acme/namespaces/dev/configmaps")
    assert received
    for sent in received:  # the create, and any read the sidecar made for it
        identity = {(k.lower(), v) for k, v in sent if k.lower().startswith("x-remote")}
        assert {("x-remote-user", "dave"), ("x-remote-tenant", "acme")} <= identity
        assert identity <= {
            ("x-remote-user", "dave"),
            ("x-remote-tenant", "acme"),
            ("x-remote-group", "developers"),
        }
        assert not [k for k, _ in sent if k.lower().startswith(("impersonate", "x_remote"))]


async def test_a_cluster_admin_acts_as_a_user_of_any_tenant(env: Env) -> None:
    """admin (system) → alice of acme via Impersonate-Extra-Tenant: a short path is
    alice's tenant, and beta stays as hidden as it is from alice."""
    as_alice = (
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "tenant-admins"),
        ("Impersonate-Extra-Tenant", "acme"),
    )
    status, body = await call(
        env, "admin", "POST", "/api/v1/namespaces/dev/configmaps", as_alice,
        body={"metadata": {"name": "by-admin-as-alice"}},
    )  # fmt: skip
    assert status == 201, body
    assert env.upstream_saw("/tenants/acme/namespaces/dev/configmaps")
    assert not env.upstream_saw("/tenants/default/")
    own = await call(env, "acme-admin", "GET", "/api/v1/tenants/beta/namespaces")
    acted = await call(env, "admin", "GET", "/api/v1/tenants/beta/namespaces", as_alice)
    assert own[0] == 404
    assert acted == own


# -- refused ------------------------------------------------------------------------------


async def test_a_developer_cannot_become_the_admin(env: Env) -> None:
    before = len(env.recorder.seen)
    status, body = await call(
        env, "acme-dev", "GET", "/api/v1/nodes", [("Impersonate-User", "admin")]
    )
    assert status == 403, body
    assert body["kind"] == "Status"
    assert body["message"] == (
        'users "admin" is forbidden: User "dave" of tenant "acme" cannot impersonate '
        'resource "users" in API group "" in tenant "acme"'
    )
    assert body["details"] == {"name": "admin", "group": "", "kind": "users"}
    assert len(env.recorder.seen) == before


# Another tenant's user (even with that tenant's admin group), and the platform's
# operators: never, whatever the policy says.
ACROSS = [
    (
        [
            ("Impersonate-User", "bert"),
            ("Impersonate-Group", "tenant-admins"),
            ("Impersonate-Extra-Tenant", "beta"),
        ],
        'users "bert" is forbidden: User "alice" of tenant "acme" cannot impersonate '
        'resource "users" in API group "" in tenant "beta": a user of tenant '
        "'acme' can never become a user of another tenant",
    ),
    (
        [("Impersonate-User", "admin"), ("Impersonate-Extra-Tenant", "system")],
        'users "admin" is forbidden: User "alice" of tenant "acme" cannot impersonate '
        'resource "users" in API group "" in tenant "system"',
    ),
]


async def test_a_tenant_admin_never_becomes_a_user_of_another_tenant(env: Env) -> None:
    before = len(env.recorder.seen)
    for headers, refused in ACROSS:
        for path in ("/api/v1/tenants/beta/namespaces", "/api/v1/nodes"):
            status, body = await call(env, "acme-admin", "GET", path, headers)
            assert status == 403, (headers, path, body)
            assert body["message"].startswith(refused), body
    assert len(env.recorder.seen) == before


MALFORMED = [
    [("Impersonate-User", "")],
    [("Impersonate-Group", "tenant-admins")],
    [("Impersonate-Uid", "0")],
    [("Impersonate-Extra-Tenant", "beta")],
    [("Impersonate-User", "dave"), ("Impersonate-User", "admin")],
    [("Impersonate-User", "dave"), ("Impersonate-Extra-Tenant", "Not_A_Tenant")],
    [("Impersonate-User", "dave"), ("Impersonate-Extra-%zz", "x")],
]


async def test_malformed_impersonation_is_400(env: Env) -> None:
    """An empty user; a group, uid or extra without a user; a user given twice; a
    tenant that is not a tenant name; an extra key that does not decode."""
    before = len(env.recorder.seen)
    for headers in MALFORMED:
        status, body = await call(env, "acme-admin", "GET", f"{DEV}/pods", headers)
        assert status == 400, (headers, body)
        assert body["kind"] == "Status"
        assert body["code"] == 400
    assert len(env.recorder.seen) == before


# -- never upstream --------------------------------------------------------------------------


async def test_impersonation_and_strip_headers_never_reach_the_upstream(
    stripping: Env,
) -> None:
    """Spellings the sidecar does not read (`Impersonate_User`, `Impersonate-Whoever`)
    are dropped too, and so is every header `identity.stripHeaders` names, in either
    spelling."""
    env = stripping
    sent = [
        ("Impersonate_User", "admin"),
        ("Impersonate-Whoever", "admin"),
        ("X-Auth-Request-User", "admin"),
        ("x_forwarded_user", "admin"),
        ("X-Forwarded-User", "admin"),
        ("X-Kept", "yes"),
    ]
    status, body = await call(env, "acme-admin", "GET", f"{DEV}/configmaps?limit=7", sent)
    assert status == 200, body
    (forwarded,) = upstream_headers(env, "/configmaps?limit=7")
    names = {k.lower() for k, _ in forwarded}
    assert "x-kept" in names
    assert not {n for n in names if n.startswith("impersonate")}
    assert not names & {"x-auth-request-user", "x_forwarded_user", "x-forwarded-user"}
    assert ("X-Remote-User", "alice") in forwarded


# -- audit --------------------------------------------------------------------------------


async def test_the_audit_line_records_both(env: Env) -> None:
    status, _ = await call(env, "acme-admin", "GET", f"{DEV}/pods", AS_DAVE, request_id="imp-ok")
    assert status == 200
    record = await audit_record(env, "imp-ok")
    assert (record["user"], record["tenant"], record["groups"]) == ("dave", "acme", ["developers"])
    assert record["impersonatedBy"] == {"user": "alice", "tenant": "acme"}
    assert record["impersonation"]["decision"] == "allowed"

    status, _ = await call(
        env, "acme-dev", "GET", f"{DEV}/pods", [("Impersonate-User", "alice")], request_id="imp-no"
    )
    assert status == 403
    record = await audit_record(env, "imp-no")
    assert (record["user"], record["tenant"]) == ("dave", "acme")
    assert "impersonatedBy" not in record
    assert record["impersonation"]["user"] == "alice"
    assert record["impersonation"]["decision"] == "refused"
    assert record["status"] == 403


# -- who pays ---------------------------------------------------------------------------------

BURST = 5
RATE_LIMITS = f"""\
kind: RateLimit
metadata: {{name: default}}
spec: {{tenant: "*", rate: 0.001, burst: {BURST}}}
---
kind: RateLimit
metadata: {{name: operators}}
spec: {{tenant: system, rate: 1000, burst: 1000}}
"""


async def test_the_callers_tenant_pays(tmp_path: Path) -> None:
    """An operator acting as alice of acme spends the operators' budget, never acme's;
    refused impersonations cost the caller's tenant like any refusal."""
    policies = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, policies)
    (policies / "60-rate-limits.yaml").write_text(RATE_LIMITS)
    async with running(tmp_path, policies) as env:
        await seed(env)
        as_alice = (
            ("Impersonate-User", "alice"),
            ("Impersonate-Group", "tenant-admins"),
            ("Impersonate-Extra-Tenant", "acme"),
        )
        for _ in range(3 * BURST):
            status, body = await call(env, "admin", "GET", "/api/v1/namespaces/dev/pods", as_alice)
            assert status == 200, body  # acted as alice...
        received = upstream_headers(env, "/tenants/acme/namespaces/dev/pods")
        assert len(received) == 3 * BURST
        assert all(("X-Remote-User", "alice") in h for h in received)
        # ...and acme's own budget is whole.
        for _ in range(BURST):
            status, body = await call(env, "acme-admin", "GET", f"{DEV}/pods")
            assert status == 200, body
        status, _ = await call(env, "acme-admin", "GET", f"{DEV}/pods")
        assert status == 429

        # beta's admin tries to act as an acme user: refused, and paid by beta.
        as_acme = (("Impersonate-User", "alice"), ("Impersonate-Extra-Tenant", "acme"))
        statuses = [
            (await call(env, "beta-admin", "GET", "/api/v1/tenants/beta/namespaces", as_acme))[0]
            for _ in range(2 * BURST)
        ]
        assert statuses == [403] * BURST + [429] * BURST


# -- open watches --------------------------------------------------------------------------------

# The shipped tenant-admin role without `impersonate`: alice keeps every other right.
NO_IMPERSONATION = """\
kind: ClusterRole
metadata:
  name: tenant-admin
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: [get, list, watch, create, update, patch, delete, deletecollection]
---
kind: TenantRoleBinding
metadata:
  name: tenant-admins
  tenant: acme
roleRef:
  kind: ClusterRole
  name: tenant-admin
subjects:
- kind: Group
  name: tenant-admins
"""


async def test_a_watch_acts_as_the_impersonated_user_until_the_grant_goes(tmp_path: Path) -> None:
    """alice watches as dave: the watch opens (its identity is dave, as the
    impersonation made it), and ends when the policy stops alice impersonating, though
    both alice and dave may still watch. (The store without the recording
    pass-through, which cannot stream a watch.)"""
    policies = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, policies)
    store = await asyncio.to_thread(processes.start_store, tmp_path)
    sidecar = None
    try:
        settings = {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(processes.write_tokens(tmp_path, TOKENS))},
            "reload": {"enabled": True, "debounceSeconds": 0.1, "pollSeconds": 0.2},
        }
        sidecar = await asyncio.to_thread(processes.start_sidecar, tmp_path, settings)
        async with aiohttp.ClientSession() as http:
            env = Env(sidecar.url, Recorder(store.url), http, sidecar)
            await seed(env)
            await _watch_until_the_grant_goes(env, policies)
    finally:
        if sidecar is not None:
            await asyncio.to_thread(sidecar.stop)
        await asyncio.to_thread(store.stop)


async def _watch_until_the_grant_goes(env: Env, policies: Path) -> None:
    sent = CIMultiDict([("Authorization", "Bearer acme-admin"), *AS_DAVE])
    watch = await env.http.get(
        URL(env.url + f"{DEV}/configmaps?watch=true", encoded=True),
        headers=sent,
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )
    try:
        assert watch.status == 200, await watch.text()

        async def create(name: str) -> None:
            status, body = await call(
                env, "admin", "POST", f"{DEV}/configmaps", body={"metadata": {"name": name}}
            )
            assert status == 201, body

        await create("seen")
        line = await asyncio.wait_for(watch.content.readline(), WITHIN)
        assert json.loads(line)["object"]["metadata"]["name"] == "seen"

        # acme's tenant admins may no longer impersonate (and may still do all else).
        (policies / "10-tenant-admin.yaml").write_text(NO_IMPERSONATION)

        async def refused() -> bool:
            status, _ = await call(env, "acme-admin", "GET", f"{DEV}/pods", AS_DAVE)
            return status == 403

        await eventually(refused, WITHIN, what="the new policy is in force")
        await create("after")
        rest = await asyncio.wait_for(watch.content.read(), WITHIN)
        assert b'"after"' not in rest
    finally:
        watch.close()

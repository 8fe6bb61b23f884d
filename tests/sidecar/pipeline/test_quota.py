"""The quota stage and the quota API through a real in-process sidecar, in front of a
real aiohttp upstream on 127.0.0.1 that plays the backing store's create/delete."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.app import build_app
from sidecar.config.settings import load_config
from tests.rigs import processes
from tests.rigs.policies import admin_policy
from tests.rigs.waiting import eventually

POLICY = admin_policy(
    'servers: 3, requests.cpu: "1", requests.memory: 1Gi',
    {"acme": "alice", "beta": "bob"},
    "kind: ResourceQuota\nmetadata: {name: dev, tenant: acme, namespace: tight}\nspec: {hard: {servers: 1}}",
)

ADMIN = {"Authorization": "Bearer admin-token"}
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
SERVERS = "/apis/compute/v1/tenants/acme/namespaces/dev/servers"


class Store:
    """A stand-in backing store: creates answer 201 with the object (or a chosen
    failure), an object reads back by name, anything else answers 200."""

    def __init__(self) -> None:
        self.fail_status = 0
        self.delay = 0.0  # how long a create's answer takes, once the object is made
        self.created: list[str] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.tenants = {"acme", "beta"}
        # What the store adds to a created object (as an API server's defaulting does).
        self.defaults: dict[str, Any] = {}
        # What an update or patch of a server makes of it (a dry run's answer too).
        self.updated: dict[str, Any] | None = None
        # (method, path with query, body, headers) of every request.
        self.seen: list[tuple[str, str, bytes, dict[str, list[str]]]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/tenants/{t}", self.tenant)
        app.router.add_route("*", "/{tail:.*}", self.any)
        return app

    async def tenant(self, request: web.Request) -> web.Response:
        t = request.match_info["t"]
        if t in self.tenants:
            return web.json_response({"metadata": {"name": t}})
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    async def any(self, request: web.Request) -> web.Response:
        headers: dict[str, list[str]] = {}
        for key, value in request.headers.items():
            headers.setdefault(key.lower(), []).append(value)
        self.seen.append((request.method, request.raw_path, await request.read(), headers))
        if self.fail_status:
            return web.json_response({"kind": "Status"}, status=self.fail_status)
        if request.method == "POST":
            body = await request.json()
            name = body.get("metadata", {}).get("name") or f"gen{len(self.created)}"
            body.setdefault("metadata", {})["name"] = name
            body.update(self.defaults)
            self.created.append(name)
            self.objects[name] = body
            if self.delay:
                await asyncio.sleep(self.delay)  # the behaviour under test: a slow answer
            return web.json_response(body, status=201)
        if request.method == "GET" and request.path.rpartition("/")[0].endswith("/servers"):
            obj = self.objects.get(request.path.rpartition("/")[2])
            if obj is None:
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            return web.json_response(obj)
        if request.method in ("PUT", "PATCH") and self.updated is not None:
            return web.json_response(self.updated)
        return web.json_response({"kind": "Status", "status": "Success"})


@pytest.fixture
async def store() -> AsyncIterator[tuple[Store, TestServer]]:
    s = Store()
    server = TestServer(s.app(), host="127.0.0.1")
    await server.start_server()
    yield s, server
    await server.close()


async def start(tmp: Path, upstream: str, **extra: Any) -> TestServer:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(POLICY)
    tokens = processes.write_tokens(
        tmp,
        [
            {"token": "admin-token", "user": "admin", "tenant": "system", "groups": []},
            {"token": "alice-token", "user": "alice", "tenant": "acme", "groups": []},
            {"token": "bob-token", "user": "bob", "tenant": "beta", "groups": []},
        ],
    )
    raw: dict[str, Any] = {
        "upstream": upstream,
        "policies": str(policies),
        "identity": {"tokenFile": str(tokens)},
        "ledger": f"sqlite:///{tmp / 'ledger.db'}",
        "audit": {"path": str(tmp / "audit.log")},
        "reload": {"enabled": False},
        "limits": {"upstreamReadTimeout": 1.0},
        # A create the store did not make is released this soon after its exchange.
        "quota": {"settleAfterSeconds": 0.5},
    }
    raw.update(extra)
    config = load_config(processes.write_config(tmp, raw), env={})
    server = TestServer(build_app(config), host="127.0.0.1")
    await server.start_server()
    return server


@pytest.fixture
async def sidecar(tmp_path: Path, store: tuple[Store, TestServer]) -> AsyncIterator[TestServer]:
    server = await start(tmp_path, str(store[1].make_url("")).rstrip("/"))
    yield server
    await server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def u(server: TestServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def versioned(body: dict[str, Any], rv: str) -> dict[str, Any]:
    """`body` as a store answers it: with its resourceVersion."""
    return {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": rv}}


def server_body(name: str | None, cpu: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name} if name else {}}
    if cpu is not None:
        body["spec"] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    return body


async def create(
    http: aiohttp.ClientSession,
    server: TestServer,
    body: dict[str, Any],
    path: str = SERVERS,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    async with http.post(u(server, path), json=body, headers={**ALICE, **(headers or {})}) as r:
        return r.status, await r.json()


async def show(
    http: aiohttp.ClientSession, server: TestServer, tenant: str = "acme", ns: str = ""
) -> dict[str, dict[str, Any]]:
    path = f"/quota/v1/tenants/{tenant}" + (f"/namespaces/{ns}" if ns else "")
    async with http.get(u(server, path), headers=ADMIN) as r:
        assert r.status == 200, await r.text()
        return {q["resource"]: q for q in (await r.json())["quotas"]}


async def test_creates_are_counted_and_refused_over_quota(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    for i in range(3):
        status, _ = await create(http, sidecar, server_body(f"s{i}", "250m"))
        assert status == 201
    status, body = await create(http, sidecar, server_body("s3"))
    assert status == 403
    assert body["reason"] == "QuotaExceeded"
    assert body["details"] == {
        "scope": "tenant",
        "tenant": "acme",
        "namespace": "dev",
        "resource": "servers",
        "requested": 1,
        "used": 3,
        "inProgress": 0,
        "limit": 3,
    }
    assert "servers" in body["message"]
    assert "tenant acme" in body["message"]
    q = await show(http, sidecar)
    assert q["servers"]["used"] == 3
    assert q["servers"]["available"] == 0
    assert q["requests.cpu"]["used"] == "750m"
    assert q["servers"]["source"] == "default"
    metrics = await (await http.get(u(sidecar, "/metrics"), headers=ADMIN)).text()
    assert 'sidecar_quota_refusals_total{resource="servers",tenant="acme"} 1.0' in metrics


async def test_cpu_over_quota_and_namespace_scope(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    status, body = await create(http, sidecar, server_body("big", "1500m"))
    assert status == 403
    assert body["details"]["resource"] == "requests.cpu"
    assert body["details"]["limit"] == "1"
    tight = "/apis/compute/v1/tenants/acme/namespaces/tight/servers"
    assert (await create(http, sidecar, server_body("t1"), tight))[0] == 201
    status, body = await create(http, sidecar, server_body("t2"), tight)
    assert status == 403
    assert body["details"]["scope"] == "namespace"
    q = await show(http, sidecar)
    assert q["servers"]["used"] == 1
    assert q["servers"]["in_progress"] == 0


async def test_bad_requests_are_400_and_reserve_nothing(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    for bad in ("lots", "-1", "1.2.3", "5Qi"):
        status, body = await create(http, sidecar, server_body("x", bad))
        assert status == 400, bad
        assert body["kind"] == "Status"
        assert "requests" in body["message"]
    json_type = {**ALICE, "Content-Type": "application/json"}
    async with http.post(u(sidecar, SERVERS), data=b"{not json", headers=json_type) as r:
        assert r.status == 400
    # A body the sidecar must read is JSON only (DESIGN §7): another type is 415.
    async with http.post(u(sidecar, SERVERS), data=b"{}", headers=ALICE) as r:
        assert r.status == 415
    q = await show(http, sidecar)
    assert q["servers"]["in_progress"] == 0
    assert q["servers"]["used"] == 0


async def settled_usage(http: aiohttp.ClientSession, server: TestServer) -> tuple[int, int]:
    """(used, in_progress) of servers once nothing is in progress any more."""
    seen: dict[str, Any] = {}

    async def done() -> bool:
        q = (await show(http, server))["servers"]
        seen.update(q)
        return bool(q["in_progress"] == 0)

    await eventually(done, what="the outcome is settled")
    return seen["used"], seen["in_progress"]


async def test_a_4xx_releases_at_once(
    sidecar: TestServer, http: aiohttp.ClientSession, store: tuple[Store, TestServer]
) -> None:
    store[0].fail_status = 409
    status, _ = await create(http, sidecar, server_body("x"))
    assert status == 409
    q = await show(http, sidecar)
    assert (q["servers"]["used"], q["servers"]["in_progress"]) == (0, 0)


@pytest.mark.parametrize(("failure", "made"), [(500, False), ("timeout", True)])
async def test_an_unseen_outcome_is_settled_against_the_store(
    sidecar: TestServer,
    http: aiohttp.ClientSession,
    store: tuple[Store, TestServer],
    failure: int | str,
    made: bool,
) -> None:
    """A 5xx or a timeout: still counted until the store says whether it made it."""
    if failure == "timeout":
        store[0].delay = 1.5  # makes it, then answers after the sidecar gave up
        expected = 504
    else:
        store[0].fail_status = int(failure)
        expected = int(failure)
    status, _ = await create(http, sidecar, server_body("x", "250m"))
    assert status == expected
    q = await show(http, sidecar)
    assert q["servers"]["used"] + q["servers"]["in_progress"] == 1
    store[0].delay, store[0].fail_status = 0.0, 0
    assert ("x" in store[0].objects) == made
    assert await settled_usage(http, sidecar) == ((1, 0) if made else (0, 0))
    q = await show(http, sidecar)
    assert q["requests.cpu"]["used"] == ("250m" if made else "0")


async def test_the_charge_recorded_is_the_stored_objects(
    sidecar: TestServer, http: aiohttp.ClientSession, store: tuple[Store, TestServer]
) -> None:
    """The store adds requests to what was sent (as defaulting does): that is charged."""
    store[0].defaults = {
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "400m"}}}]}
    }
    status, body = await create(http, sidecar, server_body("d"))
    assert status == 201, body
    q = await show(http, sidecar)
    assert q["requests.cpu"]["used"] == "400m"
    async with http.delete(u(sidecar, SERVERS + "/d"), headers=ALICE) as r:
        assert r.status == 200
    assert (await show(http, sidecar))["requests.cpu"]["used"] == "0"


async def test_upstream_refused_releases(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    server = await start(tmp_path, f"http://127.0.0.1:{processes.free_port()}")
    try:
        status, body = await create(http, server, server_body("x"))
        assert status == 502
        assert body["kind"] == "Status"
        q = await show(http, server)
        assert q["servers"]["in_progress"] == 0
        assert q["servers"]["used"] == 0
    finally:
        await server.close()


async def test_an_update_is_charged_as_the_upstreams_dry_run_answers(
    sidecar: TestServer, http: aiohttp.ClientSession, store: tuple[Store, TestServer]
) -> None:
    """DESIGN §7: the same request goes first as a `dryRun=All`, with the same body,
    Content-Type and identity headers; its answer is charged. The sidecar applies no
    patch itself: whatever the patch says, the charge is the upstream's object's."""
    assert (await create(http, sidecar, server_body("p", "100m")))[0] == 201
    patch = b'{"spec": "whatever the upstream makes of it"}'
    headers = {**ALICE, "Content-Type": "application/strategic-merge-patch+json"}
    store[0].updated = versioned(server_body("p", "1500m"), "7")  # over the 1 cpu quota
    store[0].seen.clear()
    async with http.patch(u(sidecar, SERVERS + "/p"), data=patch, headers=headers) as r:
        assert r.status == 403, await r.text()
        assert (await r.json())["reason"] == "QuotaExceeded"
    [(method, target, body, sent)] = store[0].seen  # the dry run only
    assert (method, target) == ("PATCH", SERVERS + "/p?dryRun=All")
    assert json.loads(body) == json.loads(patch)  # as read (issue 28), re-encoded
    assert sent["content-type"] == ["application/strategic-merge-patch+json"]
    assert sent["x-remote-user"] == ["alice"]
    assert sent["x-remote-tenant"] == ["acme"]
    store[0].updated = versioned(server_body("p", "700m"), "8")
    store[0].seen.clear()
    async with http.patch(u(sidecar, SERVERS + "/p"), data=patch, headers=headers) as r:
        assert r.status == 200, await r.text()
    dry, real = store[0].seen
    assert dry[1] == SERVERS + "/p?dryRun=All"
    assert real[1] == SERVERS + "/p"
    # Issue 28: the body as read, and the real write holds the dry run's version.
    assert json.loads(dry[2]) == json.loads(patch)
    assert json.loads(real[2]) == {**json.loads(patch), "metadata": {"resourceVersion": "8"}}
    for name in ("content-type", "x-remote-user", "x-remote-tenant", "x-remote-group"):
        assert dry[3].get(name) == real[3].get(name), name
    assert (await show(http, sidecar))["requests.cpu"]["used"] == "700m"
    # The upstream refuses the dry run: its answer, and nothing forwarded.
    store[0].fail_status = 422
    store[0].seen.clear()
    async with http.patch(u(sidecar, SERVERS + "/p"), data=patch, headers=headers) as r:
        assert r.status == 422
    assert [m for m, *_ in store[0].seen] == ["PATCH"]
    q = await show(http, sidecar)
    assert (q["requests.cpu"]["used"], q["requests.cpu"]["in_progress"]) == ("700m", "0")


async def test_delete_returns_charge_once(sidecar: TestServer, http: aiohttp.ClientSession) -> None:
    assert (await create(http, sidecar, server_body("gone", "500m")))[0] == 201
    for _ in range(2):
        async with http.delete(u(sidecar, SERVERS + "/gone"), headers=ALICE) as r:
            assert r.status == 200
    q = await show(http, sidecar)
    assert q["servers"]["used"] == 0
    assert q["requests.cpu"]["used"] == "0"


async def test_name_comes_from_the_response(
    sidecar: TestServer, http: aiohttp.ClientSession, store: tuple[Store, TestServer]
) -> None:
    assert (await create(http, sidecar, {"metadata": {"generateName": "w-"}}))[0] == 201
    async with http.delete(u(sidecar, SERVERS + "/" + store[0].created[-1]), headers=ALICE) as r:
        assert r.status == 200
    assert (await show(http, sidecar))["servers"]["used"] == 0


async def test_idempotency_key_never_double_counts(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    for _ in range(3):
        status, _ = await create(
            http, sidecar, server_body("same"), headers={"Idempotency-Key": "abc"}
        )
        assert status == 201
    q = await show(http, sidecar)
    assert q["servers"]["used"] == 1
    assert q["servers"]["in_progress"] == 0


async def test_untracked_creates_and_reads_pass(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        u(sidecar, "/api/v1/tenants/acme/namespaces/dev/events"),
        json={"metadata": {"name": "e"}},
        headers=ALICE,
    ) as r:
        assert r.status == 201
    q = await show(http, sidecar)
    assert "events" not in q


async def test_ledger_unreachable_fails_tracked_creates_only(
    tmp_path: Path, http: aiohttp.ClientSession, store: tuple[Store, TestServer]
) -> None:
    server = await start(
        tmp_path,
        str(store[1].make_url("")).rstrip("/"),
        ledger=f"redis://127.0.0.1:{processes.free_port()}/0",
    )
    try:
        status, body = await create(http, server, server_body("x"))
        assert status == 503
        assert "ledger" in body["message"]
        async with http.post(
            u(server, "/api/v1/tenants/acme/namespaces/dev/events"),
            json={"metadata": {"name": "e"}},
            headers=ALICE,
        ) as r:
            assert r.status == 201
        async with http.get(u(server, SERVERS), headers=ALICE) as r:
            assert r.status == 200
        metrics = await (await http.get(u(server, "/metrics"), headers=ADMIN)).text()
        assert 'sidecar_ledger_errors_total{op="reserve"} 1.0' in metrics
    finally:
        await server.close()


async def test_dry_run_forwards_over_quota(
    tmp_path: Path, http: aiohttp.ClientSession, store: tuple[Store, TestServer]
) -> None:
    server = await start(tmp_path, str(store[1].make_url("")).rstrip("/"), mode="dry-run")
    try:
        for i in range(4):
            assert (await create(http, server, server_body(f"d{i}")))[0] == 201
        q = await show(http, server)
        assert q["servers"]["used"] == 4
        assert q["servers"]["overage"] == 1
    finally:
        await server.close()


async def test_a_request_cancelled_while_forwarded_stays_in_progress(tmp_path: Path) -> None:
    """The client (or the shutdown) cancels a create while it is forwarded: whether the
    store made it is unknown, so it stays counted and is marked for settling."""
    from aiohttp.test_utils import make_mocked_request

    from sidecar.core.identity import Identity
    from sidecar.core.target import parse_target
    from sidecar.edge.proxy import Upstream
    from sidecar.pipeline.context import RequestContext
    from sidecar.pipeline.quota import QuotaStage
    from sidecar.policy.source.bundle import load_bundle
    from sidecar.services.metrics import Metrics
    from sidecar.services.quota.factory import open_ledger
    from sidecar.services.quota.gauges import QuotaGauges
    from sidecar.services.quota.ledger import ObjectRef

    (tmp_path / "policy.yaml").write_text(POLICY)
    bundle, problems = load_bundle([tmp_path])
    assert not problems
    config = load_config(env={"SIDECAR_UPSTREAM": f"http://127.0.0.1:{processes.free_port()}"})
    metrics = Metrics()
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}", 300)
    gauges = QuotaGauges(ledger, metrics, lambda: bundle.quotas, 3600)
    stage = QuotaStage(ledger, metrics, gauges, Upstream(config, metrics))
    req = make_mocked_request("POST", SERVERS, headers={"Content-Type": "application/json"})
    ctx = RequestContext(request=req, request_id="r", policy=bundle, max_body_bytes=1000)
    ctx.body = json.dumps(server_body("c")).encode()
    ctx.target = parse_target("POST", SERVERS)
    ctx.identity = Identity("alice", "acme")

    async def hang(_: RequestContext) -> web.StreamResponse:
        q = await ledger.usage("acme")
        assert q.get_in_progress("", "servers") == 1
        raise asyncio.CancelledError

    try:
        with pytest.raises(asyncio.CancelledError):
            await stage(ctx, hang)

        async def marked() -> bool:
            return bool(await ledger.unsettled("acme"))

        await eventually(marked, what="the reservation is marked unsettled")
        [(reservation, obj, _)] = await ledger.unsettled("acme")
        assert obj == ObjectRef("acme", "dev", "servers", "c")
        assert reservation.charge == {"servers": 1}
        # The store cannot be reached: it stays in progress (never released blindly).
        assert (await ledger.usage("acme")).get_in_progress("", "servers") == 1
    finally:
        await stage.stop()
        await ledger.close()


# -- the quota API --------------------------------------------------------------------


async def test_api_reads_and_authorization(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(u(sidecar, "/quota/v1/defaults"), headers=BOB) as r:
        assert r.status == 200
        assert (await r.json())["hard"] == {
            "requests.cpu": "1",
            "requests.memory": "1Gi",
            "servers": 3,
        }
    async with http.get(u(sidecar, "/quota/v1/tenants/acme"), headers=ALICE) as r:
        assert r.status == 200
    async with http.get(u(sidecar, "/quota/v1/tenants/acme/usage"), headers=ALICE) as r:
        assert r.status == 200
        assert (await r.json())["tenant"] == "acme"
    async with http.get(u(sidecar, "/quota/v1/tenants/acme"), headers=BOB) as r:
        assert r.status == 404
        assert (await r.json())["reason"] == "NotFound"
    async with http.get(
        u(sidecar, "/quota/v1/tenants/acme/namespaces/dev/usage"), headers=BOB
    ) as r:
        assert r.status == 404
    async with http.get(u(sidecar, "/quota/v1/quotas"), headers=ALICE) as r:
        assert r.status == 403
    async with http.put(
        u(sidecar, "/quota/v1/tenants/acme/servers"), headers=ALICE, json={"hard_limit": 1000}
    ) as r:
        assert r.status == 403
    async with http.put(
        u(sidecar, "/quota/v1/tenants/beta/servers"), headers=ALICE, json={"hard_limit": 1000}
    ) as r:
        # Another tenant's quota: that tenant does not exist for alice (one decision rule).
        assert r.status == 404
    async with http.get(u(sidecar, "/quota/v1/quotas"), headers=ADMIN) as r:
        assert r.status == 200
    async with http.get(u(sidecar, "/quota/v1/nothing"), headers=ADMIN) as r:
        assert r.status == 404
    async with http.get(u(sidecar, "/quota/v1/defaults")) as r:
        assert r.status == 401


async def test_api_update_persists_and_validates(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    put = u(sidecar, "/quota/v1/tenants/acme/servers")
    async with http.put(put, headers=ADMIN, json={"hard_limit": 1}) as r:
        assert r.status == 200
    assert (await create(http, sidecar, server_body("a")))[0] == 201
    assert (await create(http, sidecar, server_body("b")))[0] == 403
    async with http.put(put, headers=ADMIN, json={"hard_limit": 0}) as r:
        rows = {q["resource"]: q for q in (await r.json())["quotas"]}
        assert rows["servers"]["source"] == "api"
        assert rows["servers"]["overage"] == 1
    async with http.put(
        u(sidecar, "/quota/v1/tenants/acme/namespaces/dev/requests.memory"),
        headers=ADMIN,
        json={"hard_limit": "512Mi"},
    ) as r:
        assert r.status == 200
    ns = await show(http, sidecar, ns="dev")
    assert ns["requests.memory"]["hard_limit"] == "512Mi"
    for body in ({"hard_limit": -1}, {"hard_limit": 1.5}, {"hard_limit": "x"}, {"x": 1}, [1]):
        async with http.put(put, headers=ADMIN, json=body) as r:
            assert r.status == 400, body
    async with http.put(
        u(sidecar, "/quota/v1/tenants/acme/widgets"), headers=ADMIN, json={"hard_limit": 1}
    ) as r:
        assert r.status == 400
        assert "unknown quota resource" in (await r.json())["message"]
    async with http.put(
        u(sidecar, "/quota/v1/tenants/nosuch/servers"), headers=ADMIN, json={"hard_limit": 1}
    ) as r:
        assert r.status == 404
    async with http.get(put, headers=ADMIN) as r:
        assert r.status == 405
    async with http.put(put, headers=ADMIN, json={"hard_limit": None}) as r:
        rows = {q["resource"]: q for q in (await r.json())["quotas"]}
        assert rows["servers"]["source"] == "default"
        assert rows["servers"]["hard_limit"] == 3


async def test_deleting_a_namespace_or_tenant_returns_its_charges(
    sidecar: TestServer, http: aiohttp.ClientSession
) -> None:
    assert (await create(http, sidecar, server_body("n1")))[0] == 201
    other = "/apis/compute/v1/tenants/acme/namespaces/prod/servers"
    assert (await create(http, sidecar, server_body("p1"), other))[0] == 201
    async with http.delete(u(sidecar, "/api/v1/tenants/acme/namespaces/dev"), headers=ALICE) as r:
        assert r.status == 200
    q = await show(http, sidecar)
    assert q["servers"]["used"] == 1
    async with http.delete(u(sidecar, "/api/v1/tenants/acme"), headers=ADMIN) as r:
        assert r.status == 200
    q = await show(http, sidecar)
    assert q["servers"]["used"] == 0

"""Issue 28, finding High: a write decided on one state of an object and applied on
another (DESIGN §7: the tenant is never above its quota).

A JSON patch that copies `/status/x` (or a server's `/tags/0`) into the container's
cpu request is charged on the upstream's dry run while `x` is `100m`; a status (or
tags) write that lands between the dry run and the real write made the real write store
`1000` CPUs, booked without a check. The interleaving is made deterministic by a
pass-through between the sidecar and the real store (tests/rigs/interleave.py) that
injects the write just before the real update reaches the store, on every run: before
the fix the store held 1000 CPUs on a 4 CPU quota in every run.

Now a write is sent holding the dry run's resourceVersion: the store refuses it (409)
when the object changed, the sidecar dry-runs again and charges the new state (403
QuotaExceeded here, or success with the exact usage), and answers 409 when the object
keeps changing. A subresource write through the sidecar takes the object's claim, so it
cannot land inside a charged update at all. Real sidecar and store processes."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.rigs import processes
from tests.rigs.interleave import Interleaver, real_delete, real_write
from tests.rigs.ledgers import ledger_for_kind
from tests.rigs.paths import ROOT
from tests.rigs.policies import admin_policy
from tests.rigs.quota import (
    ALICE,
    PODS,
    QUOTA_POLICY,
    SERVERS,
    STORE_HEADERS,
    QuotaEnv,
    quota_env,
)
from tests.rigs.tenancy import SHIPPED_POLICIES, TOKENS

JSON_PATCH = "application/json-patch+json"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
CPU_PATH = "/spec/containers/0/resources/requests/cpu"


def developer_policy() -> str:
    """The shipped `developer` ClusterRole (policies/20-tenant-developer.yaml), bound to
    alice in acme/default, and acme's 4 CPU quota; alice is nothing else."""
    shipped = (ROOT / "policies" / "20-tenant-developer.yaml").read_text()
    role = next(doc for doc in shipped.split("\n---") if "kind: ClusterRole" in doc)
    binding = (
        "kind: RoleBinding\nmetadata: {name: dev-alice, tenant: acme, namespace: default}\n"
        "roleRef: {kind: ClusterRole, name: developer}\nsubjects: [{kind: User, name: alice}]\n"
    )
    return admin_policy(
        'servers: 10, requests.cpu: "4", requests.memory: 8Gi',
        {},
        role.strip("\n-") + "\n---\n" + binding,
    )


@asynccontextmanager
async def interleaved(
    tmp: Path,
    policy: str = QUOTA_POLICY,
    ledger: tuple[str, dict[str, Any]] | None = None,
) -> AsyncIterator[tuple[QuotaEnv, Interleaver]]:
    store = processes.start_store(tmp)
    rig = Interleaver(store.url)
    url, extra = ledger or (f"sqlite:///{tmp / 'ledger.db'}", {})
    try:
        async with (
            rig.running() as upstream,
            quota_env(tmp, url, upstream=upstream, store=store, policy=policy, **extra) as env,
        ):
            yield env, rig
    finally:
        store.stop()


async def direct(env: QuotaEnv, method: str, path: str, body: Any) -> int:
    """A write straight to the store (not through this sidecar: another replica's
    controller, or anything else that changes the object)."""
    async with env.http.request(
        method, env.store.url + path, json=body, headers=STORE_HEADERS
    ) as r:
        return r.status


def pod_with_status(name: str, cpu: str, x: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]
        },
        "status": {"x": x},
    }


def server_with_tags(name: str, cpu: str, tags: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]
        },
        "tags": tags,
    }


def cpu_of(obj: Any) -> Any:
    return obj["spec"]["containers"][0]["resources"]["requests"].get("cpu")


COPY_STATUS = [{"op": "copy", "from": "/status/x", "path": CPU_PATH}]
COPY_TAG = [{"op": "copy", "from": "/tags/0", "path": CPU_PATH}]


async def made_pod(env: QuotaEnv, x: str = "100m") -> None:
    status, body = await env.send("POST", PODS, pod_with_status("p", "100m", x))
    assert status == 201, body
    assert await direct(env, "PUT", PODS + "/p/status", {"status": {"x": x}}) == 200


def inject(step: Callable[[], Awaitable[Any]]) -> Callable[[web.Request], Awaitable[None]]:
    async def before(_request: web.Request) -> None:
        await step()

    return before


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_status_write_between_dry_run_and_write_is_charged(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    async with interleaved(tmp_path, ledger=ledger_for_kind(kind, tmp_path, request)) as (
        env,
        rig,
    ):
        await made_pod(env)
        assert await env.usage("requests.cpu") == ("100m", "0")
        rig.picks = real_write(PODS + "/p")
        rig.before = inject(
            lambda: direct(env, "PUT", PODS + "/p/status", {"status": {"x": "1000"}})
        )
        status, body = await env.send("PATCH", PODS + "/p", COPY_STATUS, content_type=JSON_PATCH)
        # The real write was refused (the object changed); the new state was charged.
        assert rig.picked == 1
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded", body
        assert cpu_of(await env.stored(PODS + "/p")) == "100m"
        assert await env.usage("requests.cpu") == ("100m", "0")


async def test_a_change_within_quota_succeeds_with_the_exact_usage(tmp_path: Path) -> None:
    async with interleaved(tmp_path) as (env, rig):
        await made_pod(env)
        rig.picks = real_write(PODS + "/p")

        async def change_once() -> None:
            if rig.picked == 1:
                await direct(env, "PUT", PODS + "/p/status", {"status": {"x": "300m"}})

        rig.before = inject(change_once)
        status, body = await env.send("PATCH", PODS + "/p", COPY_STATUS, content_type=JSON_PATCH)
        assert status == 200, body
        # one retry: the second real write found the object as its dry run did
        assert rig.picked == 2
        assert cpu_of(body) == cpu_of(await env.stored(PODS + "/p")) == "300m"
        assert await env.usage("requests.cpu") == ("300m", "0")


async def test_tags_race_with_the_shipped_developer_role(tmp_path: Path) -> None:
    """The finding's own attack: alice, a plain `developer`, copies tag 0 into the cpu
    request and replaces the tags in between, both through the sidecar. The tag write
    now meets the update's claim on the server (409); the update is charged as
    decided."""
    async with interleaved(tmp_path, developer_policy()) as (env, rig):
        status, body = await env.send("POST", SERVERS, server_with_tags("s", "100m", ["100m"]))
        assert status == 201, body
        tag_answers: list[int] = []

        async def retag() -> None:
            async with env.http.put(
                env.url(SERVERS + "/s/tags"), json={"tags": ["1000"]}, headers=ALICE
            ) as r:
                tag_answers.append(r.status)
                if r.status == 409:
                    body = await r.json()
                    assert (body["kind"], body["reason"]) == ("Status", "Conflict"), body

        rig.picks = real_write(SERVERS + "/s")
        rig.before = inject(retag)
        status, body = await env.send("PATCH", SERVERS + "/s", COPY_TAG, content_type=JSON_PATCH)
        assert tag_answers == [409]
        assert status == 200, body
        stored = await env.stored(SERVERS + "/s")
        assert (cpu_of(stored), stored["tags"]) == ("100m", ["100m"])
        assert await env.usage("requests.cpu") == ("100m", "0")
        # with no update in flight the developer's tag write goes through
        async with env.http.put(
            env.url(SERVERS + "/s/tags"), json={"tags": ["1000"]}, headers=ALICE
        ) as r:
            assert r.status == 200, await r.text()


async def test_tags_written_around_the_sidecar_are_caught_by_the_precondition(
    tmp_path: Path,
) -> None:
    async with interleaved(tmp_path, developer_policy()) as (env, rig):
        status, body = await env.send("POST", SERVERS, server_with_tags("s", "100m", ["100m"]))
        assert status == 201, body
        rig.picks = real_write(SERVERS + "/s")
        rig.before = inject(lambda: direct(env, "PUT", SERVERS + "/s/tags", {"tags": ["1000"]}))
        status, body = await env.send("PATCH", SERVERS + "/s", COPY_TAG, content_type=JSON_PATCH)
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded", body
        assert cpu_of(await env.stored(SERVERS + "/s")) == "100m"
        assert await env.usage("requests.cpu") == ("100m", "0")


async def test_an_object_that_keeps_changing_is_409(tmp_path: Path) -> None:
    async with interleaved(tmp_path) as (env, rig):
        await made_pod(env)
        rig.picks = real_write(PODS + "/p")
        values = iter(["200m", "300m", "400m", "500m", "600m"])

        async def change() -> None:
            await direct(env, "PUT", PODS + "/p/status", {"status": {"x": next(values)}})

        rig.before = inject(change)
        status, body = await env.send("PATCH", PODS + "/p", COPY_STATUS, content_type=JSON_PATCH)
        assert status == 409, body
        assert (body["kind"], body["reason"]) == ("Status", "Conflict"), body
        assert rig.picked == 4  # four attempts, each refused by the store
        assert cpu_of(await env.stored(PODS + "/p")) == "100m"
        assert await env.usage("requests.cpu") == ("100m", "0")


@pytest.mark.parametrize("ctype", [MERGE, "application/strategic-merge-patch+json", APPLY])
async def test_every_body_type_carries_the_decided_version(tmp_path: Path, ctype: str) -> None:
    """A merge, strategic merge and apply body raising cpu to 2 while a status write
    changes the pod in between: each real write holds the version its dry run saw; the
    first is refused by the store, the second is applied and charged exactly."""
    async with interleaved(tmp_path) as (env, rig):
        await made_pod(env)
        path = PODS + "/p" + ("?fieldManager=alice&force=true" if ctype == APPLY else "")
        rig.picks = real_write(PODS + "/p")
        values = iter(["1", "2"])

        async def change() -> None:
            if rig.picked == 1:
                await direct(env, "PUT", PODS + "/p/status", {"status": {"x": next(values)}})

        rig.before = inject(change)
        patch: dict[str, Any] = {
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2"}}}]
            }
        }
        if ctype == APPLY:
            patch = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **patch}
        status, body = await env.send("PATCH", path, patch, content_type=ctype)
        assert status == 200, json.dumps(body)
        assert rig.picked == 2
        assert cpu_of(await env.stored(PODS + "/p")) == "2"
        assert await env.usage("requests.cpu") == ("2", "0")
        real = [json.loads(b) for m, p, b in rig.seen if m == "PATCH" and "dryRun" not in p]
        versions = [r["metadata"]["resourceVersion"] for r in real]
        assert len(set(versions)) == len(versions) == 2, versions


async def test_an_apply_that_created_meets_an_object_made_meanwhile(tmp_path: Path) -> None:
    """An apply whose dry run creates the object is sent with the dry run's uid: an
    object of that name made in between (around the sidecar, so uncharged) is not
    overwritten as if it were new; the apply is decided again as an update of it."""
    async with interleaved(tmp_path) as (env, rig):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "n"},
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]
            },
        }
        made = pod_with_status("n", "3500m", "0")
        rig.picks = real_write(PODS + "/n")
        rig.before = inject(lambda: direct(env, "POST", PODS, made))
        status, answer = await env.send(
            "PATCH", PODS + "/n?fieldManager=alice&force=true", body, content_type=APPLY
        )
        assert rig.picked == 2, rig.seen
        assert status == 200, answer  # the second attempt updated the object made meanwhile
        stored = await env.stored(PODS + "/n")
        assert cpu_of(stored) == "1"
        assert await env.usage("requests.cpu") == ("1", "0")


BAD_BODIES: list[tuple[str, bytes, dict[str, str], int]] = [
    (
        "gzip",
        gzip.compress(b'{"spec": {}}'),
        {"Content-Encoding": "gzip", "Content-Type": MERGE},
        415,
    ),
    ("text", b"cpu=1000", {"Content-Type": "text/plain"}, 415),
    ("protobuf", b"k8s\x00", {"Content-Type": "application/vnd.kubernetes.protobuf"}, 415),
    ("not json", b"{spec", {"Content-Type": MERGE}, 400),
    ("empty", b"", {"Content-Type": MERGE}, 400),
    ("json patch object", b'{"op": "add"}', {"Content-Type": JSON_PATCH}, 400),
    ("merge array", b"[1]", {"Content-Type": MERGE}, 400),
    ("metadata string", b'{"metadata": "x"}', {"Content-Type": MERGE}, 400),
    ("metadata null", b'{"metadata": null}', {"Content-Type": MERGE}, 400),
    ("1e400", b'{"spec": {"x": 1e400}}', {"Content-Type": MERGE}, 400),
    ("NaN", b'{"spec": {"x": NaN}}', {"Content-Type": MERGE}, 400),
    (
        "yaml inf",
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nx: .inf\n",
        {"Content-Type": APPLY},
        400,
    ),
    ("yaml garbage", b"a: [b\n", {"Content-Type": APPLY}, 400),
    (
        "yaml aliases",
        b"a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
        b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c]\n",
        {"Content-Type": APPLY},
        400,
    ),
    ("yaml binary", b"x: !!binary aGVsbG8=\n", {"Content-Type": APPLY}, 400),
    ("yaml recursive", b"a: &a [*a]\n", {"Content-Type": APPLY}, 400),
    ("yaml python", b"a: !!python/object:os.system [ls]\n", {"Content-Type": APPLY}, 400),
    ("yaml huge int", b"a: " + b"9" * 5000 + b"\n", {"Content-Type": APPLY}, 400),
    ("yaml two docs", b"a: 1\n---\nb: 2\n", {"Content-Type": APPLY}, 400),
    ("not utf-8", b"a: \xff\xfe\n", {"Content-Type": APPLY}, 400),
    ("put yaml", b"a: 1", {"Content-Type": "application/yaml"}, 415),
    ("deep", b'{"a":' * 200 + b"1" + b"}" * 200, {"Content-Type": MERGE}, 400),
]


async def test_bad_bodies_are_a_status_with_nothing_stored_or_charged(tmp_path: Path) -> None:
    async with interleaved(tmp_path) as (env, rig):
        await made_pod(env)
        before = await env.stored(PODS + "/p")
        for what, raw, headers, code in BAD_BODIES:
            method = "PATCH"
            async with env.http.request(
                method,
                env.url(PODS + "/p?fieldManager=alice"),
                data=raw,
                headers={**ALICE, **headers},
            ) as r:
                text = await r.text()
                assert r.status == code, (what, r.status, text)
                status_body = json.loads(text)
                assert (status_body["kind"], status_body["code"]) == ("Status", code), what
                assert "Traceback" not in text
        assert await env.stored(PODS + "/p") == before
        assert await env.usage("requests.cpu") == ("100m", "0")
        assert await env.usage("pods") == (1, 0)
        # nothing of it reached the store for real
        assert not [s for s in rig.seen if s[0] == "PATCH" and "dryRun" not in s[1]]


# -- owner rules: the owner a write was decided on is the owner it lands on ---------------

NODES = "/api/v1/nodes"


@asynccontextmanager
async def owners_env(
    tmp: Path, policies: Path = SHIPPED_POLICIES
) -> AsyncIterator[tuple[Interleaver, str, processes.Proc]]:
    """The shipped policies, the real store behind the interleaving rig, the sidecar."""
    store = processes.start_store(tmp)
    rig = Interleaver(store.url)
    try:
        async with rig.running() as url:
            tokens = processes.write_tokens(tmp, TOKENS)
            settings = {
                "upstream": url,
                "policies": str(policies),
                "identity": {"tokenFile": str(tokens)},
                "reload": {"enabled": False},
                "ledger": f"sqlite:///{tmp / 'ledger.db'}",
            }
            sidecar = await asyncio.to_thread(processes.start_sidecar, tmp, settings)
            try:
                yield rig, sidecar.url, store
            finally:
                sidecar.stop()
    finally:
        store.stop()


async def call(url: str, token: str, method: str, path: str, body: Any, ctype: str) -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method,
            url + path,
            data=None if body is None else json.dumps(body),
            headers={"Authorization": f"Bearer {token}", "Content-Type": ctype},
        ) as r,
    ):
        return r.status, await r.json()


@pytest.mark.parametrize("ctype", [MERGE, JSON_PATCH, "application/strategic-merge-patch+json"])
async def test_a_node_given_away_meanwhile_is_not_written(tmp_path: Path, ctype: str) -> None:
    """acme's node owner patches node n, owned by acme when its owner is read; the
    admin gives n to beta before the write lands. The write held acme's read of n: the
    store refuses it, the sidecar decides again on beta's node (404 to acme) and beta's
    node is untouched."""
    async with owners_env(tmp_path) as (rig, url, store):
        for tenant in ("acme", "beta"):
            assert (
                await call(
                    url,
                    "admin",
                    "POST",
                    "/api/v1/tenants",
                    {"metadata": {"name": tenant}},
                    "application/json",
                )
            )[0] == 201
        node = {"metadata": {"name": "n"}, "spec": {"resource_class": "gpu", "owner": "acme"}}
        assert (await call(url, "admin", "POST", NODES, node, "application/json"))[0] == 201

        async def give_away() -> None:
            async with (
                aiohttp.ClientSession() as http,
                http.patch(
                    store.url + NODES + "/n",
                    json={"spec": {"owner": "beta"}},
                    headers={**STORE_HEADERS, "Content-Type": MERGE},
                ) as r,
            ):
                assert r.status == 200

        rig.picks = real_write(NODES + "/n")
        rig.before = inject(give_away)
        body: Any = {"spec": {"resource_class": "acme-was-here"}}
        if ctype == JSON_PATCH:
            body = [{"op": "replace", "path": "/spec/resource_class", "value": "acme-was-here"}]
        status, answer = await call(url, "acme-owner", "PATCH", NODES + "/n", body, ctype)
        assert status == 404, answer
        assert answer["kind"] == "Status"
        rig.before = None
        status, stored = await call(url, "admin", "GET", NODES + "/n", None, "application/json")
        assert status == 200
        assert stored["spec"] == {"resource_class": "gpu", "owner": "beta"}


# -- deletes: a charge is returned only for what the delete removed -----------------------


async def test_an_object_made_again_while_a_delete_answers_keeps_its_charge(
    tmp_path: Path,
) -> None:
    """The store deleted pod p; before its answer reached the sidecar, p was made again
    (through the sidecar: charged). The delete returned the new p's charge, which the
    store still holds: usage under what is stored (room for more than the quota)."""
    async with interleaved(tmp_path) as (env, rig):
        status, body = await env.send("POST", PODS, pod_with_status("p", "1", "0"))
        assert status == 201, body

        async def make_again() -> None:
            status, body = await env.send("POST", PODS, pod_with_status("p", "1", "0"))
            assert status == 201, json.dumps(body)

        rig.picks = real_delete(PODS + "/p")
        rig.after = inject(make_again)
        status, body = await env.send("DELETE", PODS + "/p")
        assert status == 200, body
        assert rig.picked == 1
        assert cpu_of(await env.stored(PODS + "/p")) == "1"
        assert await env.usage("requests.cpu") == ("1", "0")
        status, body = await env.send("POST", PODS, pod_with_status("q", "3500m", "0"))
        assert status == 403, body


async def test_a_namespace_made_again_while_its_delete_answers_keeps_its_charges(
    tmp_path: Path,
) -> None:
    async with interleaved(tmp_path) as (env, rig):
        ns = "/api/v1/tenants/acme/namespaces"
        pods = f"{ns}/work/pods"
        assert (await env.send("POST", ns, {"metadata": {"name": "work"}}))[0] == 201
        assert (await env.send("POST", pods, pod_with_status("p", "1", "0")))[0] == 201

        async def make_again() -> None:
            assert (await env.send("POST", ns, {"metadata": {"name": "work"}}))[0] == 201
            status, body = await env.send("POST", pods, pod_with_status("p", "1", "0"))
            assert status == 201, body

        rig.picks = real_delete(ns + "/work")
        rig.after = inject(make_again)
        status, body = await env.send("DELETE", ns + "/work")
        assert status == 200, body
        assert cpu_of(await env.stored(pods + "/p")) == "1"
        assert await env.usage("requests.cpu") == ("1", "0")


NODE_DELETER = """
kind: ClusterRole
metadata: {name: node-deleter}
rules:
- apiGroups: [""]
  resources: [nodes]
  verbs: [delete]
  when: owner
---
kind: TenantRoleBinding
metadata: {name: node-deleters, tenant: acme}
roleRef: {kind: ClusterRole, name: node-deleter}
subjects: [{kind: Group, name: node-owners}]
"""


async def seeded_node(url: str) -> None:
    for tenant in ("acme", "beta"):
        status, _ = await call(
            url, "admin", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}, MERGE
        )
        assert status == 201
    node = {"metadata": {"name": "n"}, "spec": {"resource_class": "gpu", "owner": "acme"}}
    assert (await call(url, "admin", "POST", NODES, node, "application/json"))[0] == 201


def giving_away(store: processes.Proc) -> Callable[[web.Request], Awaitable[None]]:
    async def give_away(_request: web.Request) -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.patch(
                store.url + NODES + "/n",
                json={"spec": {"owner": "beta"}},
                headers={**STORE_HEADERS, "Content-Type": MERGE},
            ) as r,
        ):
            assert r.status == 200

    return give_away


async def test_a_node_given_away_meanwhile_is_not_powered(tmp_path: Path) -> None:
    async with owners_env(tmp_path) as (rig, url, store):
        await seeded_node(url)
        rig.picks = lambda r: r.method == "PUT" and r.path == NODES + "/n/power"
        rig.before = giving_away(store)
        status, answer = await call(
            url,
            "acme-owner",
            "PUT",
            NODES + "/n/power",
            {"target": "power off"},
            "application/json",
        )
        assert status == 404, answer
        rig.before = None
        status, stored = await call(url, "admin", "GET", NODES + "/n", None, "application/json")
        assert stored["spec"]["owner"] == "beta"
        assert (stored.get("status") or {}).get("power_state") != "power off"


async def test_a_node_given_away_meanwhile_is_not_deleted(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, policies)
    (policies / "99-node-deleter.yaml").write_text(NODE_DELETER)
    async with owners_env(tmp_path, policies) as (rig, url, store):
        await seeded_node(url)
        rig.picks = lambda r: r.method == "DELETE" and r.path == NODES + "/n"
        rig.before = giving_away(store)
        status, answer = await call(url, "acme-owner", "DELETE", NODES + "/n", None, MERGE)
        assert status == 404, answer
        rig.before = None
        status, stored = await call(url, "admin", "GET", NODES + "/n", None, "application/json")
        assert status == 200, stored
        assert stored["spec"]["owner"] == "beta"
        # acme's own node it may still delete (with or without DeleteOptions)
        node = {"metadata": {"name": "m"}, "spec": {"resource_class": "gpu", "owner": "acme"}}
        assert (await call(url, "admin", "POST", NODES, node, "application/json"))[0] == 201
        # bad DeleteOptions: a Status, nothing deleted; another version: 409 after retries
        for bad, code in (
            ([1], 400),
            ({"preconditions": "x"}, 400),
            ({"preconditions": {"resourceVersion": "1"}}, 409),
            ({"preconditions": {"uid": "not-its-uid"}}, 409),
        ):
            status, answer = await call(url, "acme-owner", "DELETE", NODES + "/m", bad, MERGE)
            assert (status, answer["kind"]) == (code, "Status"), (bad, answer)
        assert (await call(url, "admin", "GET", NODES + "/m", None, MERGE))[0] == 200
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        status, answer = await call(url, "acme-owner", "DELETE", NODES + "/m", options, MERGE)
        assert status == 200, answer
        assert (await call(url, "admin", "POST", NODES, node, "application/json"))[0] == 201
        status, answer = await call(url, "acme-owner", "DELETE", NODES + "/m", None, MERGE)
        assert status == 200, answer

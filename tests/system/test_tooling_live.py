"""Hot reload, audit and dry-run against a running sidecar (real processes on loopback:
the reference backing store and `sidecar serve`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.policy.source.files import load_documents
from tests.rigs import processes
from tests.rigs.waiting import eventually

ROLE = """\
kind: ClusterRole
metadata: {name: pod-reader}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: everything}
subjects:
- {kind: User, name: admin}
---
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
- {nonResourceURLs: ["*"], verbs: ["*"]}
"""

GRANT = """\
kind: TenantRoleBinding
metadata: {name: readers, tenant: acme}
roleRef: {kind: ClusterRole, name: pod-reader}
subjects:
- {kind: User, name: bob}
"""

PODS = "/api/v1/tenants/acme/namespaces/default/pods"
BETA_PODS = "/api/v1/tenants/beta/namespaces/default/pods"
TOKENS = [
    {"token": "t-admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "t-bob", "user": "bob", "tenant": "acme", "groups": []},
    {"token": "t-carl", "user": "carl", "tenant": "beta", "groups": []},
]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Live:
    def __init__(
        self, tmp: Path, store: processes.Proc, reload: dict[str, Any], mode: str = "enforce"
    ) -> None:
        self.dir = tmp / "policies"
        self.dir.mkdir()
        (self.dir / "roles.yaml").write_text(ROLE)
        self.audit = tmp / "audit.log"
        tokens = processes.write_tokens(tmp, TOKENS)
        self.proc = processes.start_sidecar(
            tmp,
            {
                "upstream": store.url,
                "policies": str(self.dir),
                "mode": mode,
                "identity": {"tokenFile": str(tokens)},
                "audit": {"path": str(self.audit)},
                "reload": reload,
            },
        )
        self.url = self.proc.url

    def revision(self) -> str:
        return load_documents([str(self.dir)]).revision

    def audit_records(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.audit.read_text().splitlines() if x.strip()]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[processes.Proc]:
    proc = processes.start_store(tmp_path)
    yield proc
    proc.stop()


async def call(
    http: aiohttp.ClientSession,
    url: str,
    token: str,
    path: str = PODS,
    method: str = "GET",
    body: Any = None,
) -> tuple[int, dict[str, Any]]:
    async with http.request(method, url + path, headers=auth(token), json=body) as resp:
        data = await resp.read()
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {}
        return resp.status, parsed


async def ready(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/readyz") as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def metric(http: aiohttp.ClientSession, url: str, prefix: str) -> float:
    # /metrics is authorized like any non-resource URL (DESIGN §9).
    async with http.get(url + "/metrics", headers=auth("t-admin")) as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def create_tenant(http: aiohttp.ClientSession, url: str, name: str) -> None:
    status, body = await call(
        http, url, "t-admin", "/api/v1/tenants", "POST", {"metadata": {"name": name}}
    )
    assert status in (200, 201), body


async def test_good_change_takes_effect_and_broken_change_is_refused(
    tmp_path: Path, store: processes.Proc
) -> None:
    live = Live(tmp_path, store, {"debounceSeconds": 0.1})
    try:
        async with aiohttp.ClientSession() as http:
            await create_tenant(http, live.url, "acme")
            status, body = await call(http, live.url, "t-bob")
            assert status == 403
            assert body["reason"] == "Forbidden"
            good_revision_before = live.revision()

            (live.dir / "grant.yaml").write_text(GRANT)
            new_revision = live.revision()
            assert new_revision != good_revision_before

            async def bob_allowed() -> bool:
                return (await call(http, live.url, "t-bob"))[0] == 200

            start = time.monotonic()
            await eventually(bob_allowed, 10, what="bob allowed")
            took = time.monotonic() - start
            print(f"good change in force after {took:.2f} s")
            detail = (await ready(http, live.url))["checks"]["policy"]["detail"]
            assert new_revision in detail

            # A broken change: refused, the last good policy stays, traffic continues.
            (live.dir / "broken.yaml").write_text("kind: ClusterRole\nmetadata: {name: [\n")

            async def refused() -> bool:
                checks = (await ready(http, live.url))["checks"]["policy"]
                return "refused" in checks["detail"]

            statuses: list[int] = []

            async def traffic() -> None:
                while len(statuses) < 400:
                    statuses.append((await call(http, live.url, "t-bob"))[0])

            task = asyncio.create_task(traffic())
            await eventually(refused, 10)
            await task
            assert set(statuses) == {200}
            body = await ready(http, live.url)
            assert body["ready"] is True
            policy = body["checks"]["policy"]
            assert policy["ok"] is True
            # /readyz counts the problems; the log names the files (DESIGN §9).
            assert "1 problem(s)" in policy["detail"]
            assert str(live.dir) not in policy["detail"]
            assert new_revision in policy["detail"]
            assert (
                await metric(http, live.url, 'sidecar_policy_reload_total{result="failure"}') >= 1
            )
            assert (
                await metric(http, live.url, f'sidecar_policy_info{{revision="{new_revision}"}}')
                == 1
            )
            assert "broken.yaml:3: not valid YAML" in live.proc.log()

            # Fixing it clears the refusal.
            (live.dir / "broken.yaml").unlink()

            async def cleared() -> bool:
                return "refused" not in (await ready(http, live.url))["checks"]["policy"]["detail"]

            await eventually(cleared)
            assert live.proc.proc.poll() is None
    finally:
        live.proc.stop()


async def test_concurrent_requests_during_100_reloads_are_consistent(
    tmp_path: Path, store: processes.Proc
) -> None:
    """Swap between policy A (bob may read pods) and B (he may not) 100 times via
    SIGHUP while requests run; every audited request was decided by the revision it
    names, and that revision's answer is the one the client got."""
    live = Live(tmp_path, store, {"enabled": False})
    grant = live.dir / "grant.yaml"
    revision_b = live.revision()
    grant.write_text(GRANT)
    revision_a = live.revision()
    grant.unlink()
    try:
        async with aiohttp.ClientSession() as http:
            await create_tenant(http, live.url, "acme")
            seen: list[tuple[str, int]] = []
            stop = asyncio.Event()

            async def client() -> None:
                while not stop.is_set():
                    rid = os.urandom(8).hex()
                    async with http.get(
                        live.url + PODS, headers={**auth("t-bob"), "X-Request-Id": rid}
                    ) as r:
                        await r.read()
                        seen.append((rid, r.status))

            clients = [asyncio.create_task(client()) for _ in range(4)]
            for i in range(100):
                want = revision_a if i % 2 == 0 else revision_b
                if i % 2 == 0:
                    tmp = live.dir / ".grant.tmp"
                    tmp.write_text(GRANT)
                    tmp.rename(grant)
                else:
                    grant.unlink()
                os.kill(live.proc.pid, signal.SIGHUP)

                # The revision in force as /metrics shows it: set at the swap itself
                # (/readyz reuses its answer for half a second, 100 times over).
                async def swapped(want: str = want) -> bool:
                    info = f'sidecar_policy_info{{revision="{want}"}}'
                    return await metric(http, live.url, info) == 1

                await eventually(swapped, 10)
            stop.set()
            await asyncio.gather(*clients)
            successes = await metric(
                http, live.url, 'sidecar_policy_reload_total{result="success"}'
            )
            assert successes >= 100
        live.proc.stop()
        records = {r["requestId"]: r for r in live.audit_records()}
        assert len(seen) > 100
        by_revision = {revision_a: 0, revision_b: 0}
        for rid, status in seen:
            record = records[rid]
            assert record["revision"] in by_revision, record
            by_revision[record["revision"]] += 1
            expected = 200 if record["revision"] == revision_a else 403
            assert status == expected == record["status"], record
        assert by_revision[revision_a] > 0
        assert by_revision[revision_b] > 0
        print(f"{len(seen)} requests across 100 reloads: {by_revision}")
    finally:
        live.proc.stop()


async def test_dry_run_per_tenant_forwards_logs_and_counts(
    tmp_path: Path, store: processes.Proc
) -> None:
    live = Live(tmp_path, store, {"debounceSeconds": 0.1})
    try:
        async with aiohttp.ClientSession() as http:
            for tenant in ("acme", "beta"):
                await create_tenant(http, live.url, tenant)
            assert (await call(http, live.url, "t-carl", BETA_PODS))[0] == 403
            (live.dir / "modes.yaml").write_text(
                "kind: TenantMode\nmetadata: {name: beta}\nspec: {tenant: beta, mode: dry-run}\n"
            )

            async def forwarded() -> bool:
                return (await call(http, live.url, "t-carl", BETA_PODS))[0] == 200

            await eventually(forwarded)
            # acme is still enforced.
            status, body = await call(http, live.url, "t-bob")
            assert status == 403
            assert body["reason"] == "Forbidden"
            would_deny = await metric(
                http, live.url, 'sidecar_decisions_total{outcome="would_deny",tenant="beta"}'
            )
            assert would_deny >= 1
        live.proc.stop()
        carl = [r for r in live.audit_records() if r["user"] == "carl" and r["status"] == 200]
        assert carl
        record = carl[-1]
        assert record["decision"] == "deny"
        assert record["authz"]["mode"] == "dry-run"
        assert "cannot list" in record["reason"]
        assert record["revision"] == live.revision()
    finally:
        live.proc.stop()


async def test_global_dry_run_mode(tmp_path: Path, store: processes.Proc) -> None:
    live = Live(tmp_path, store, {"enabled": False}, mode="dry-run")
    try:
        async with aiohttp.ClientSession() as http:
            await create_tenant(http, live.url, "acme")
            status, _ = await call(http, live.url, "t-bob")
            assert status == 200
            assert (
                await metric(
                    http, live.url, 'sidecar_decisions_total{outcome="would_deny",tenant="acme"}'
                )
                == 1
            )
    finally:
        live.proc.stop()


async def test_audit_line_fields(tmp_path: Path, store: processes.Proc) -> None:
    live = Live(tmp_path, store, {"enabled": False})
    try:
        async with aiohttp.ClientSession() as http:
            await create_tenant(http, live.url, "acme")
            async with http.get(
                live.url + PODS, headers={**auth("t-bob"), "X-Request-Id": "audit-1"}
            ) as r:
                assert r.status == 403
        live.proc.stop()
        record = {r["requestId"]: r for r in live.audit_records()}["audit-1"]
        for key in (
            "time",
            "requestId",
            "user",
            "tenant",
            "verb",
            "resource",
            "targetTenant",
            "namespace",
            "name",
            "decision",
            "reason",
            "revision",
            "status",
            "latencyMs",
        ):
            assert key in record, key
        assert (record["user"], record["tenant"], record["verb"], record["resource"]) == (
            "bob",
            "acme",
            "list",
            "pods",
        )
        assert (record["targetTenant"], record["namespace"]) == ("acme", "default")
        assert record["decision"] == "deny"
        assert record["status"] == 403
        assert record["revision"] == live.revision()
    finally:
        live.proc.stop()

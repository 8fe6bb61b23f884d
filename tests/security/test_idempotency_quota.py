"""Finding 3: an `Idempotency-Key` must never let a create skip the quota (DESIGN §7).

Against the real sidecar and the real backing store, on both ledgers (a SQLite file and
the real Redis under the test's own prefix): one key can never create more objects
than the limit, a key reused on another path or with another body is 422, a retry
while the first create is still in flight is 409, and a retry after it succeeded gets
the first answer replayed without being charged again (tests/security/
test_ambiguous_outcomes.py: also when the quota is full by then).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from tests.rigs import processes
from tests.rigs.ledgers import ledger_for_kind
from tests.rigs.quota import (
    ALICE,
    CONFIGMAPS,
    PODS,
    SERVERS,
    Gate,
    pod,
    quota_env,
)

KINDS = ["sqlite", "redis"]


@pytest.mark.parametrize("kind", KINDS)
async def test_one_key_never_creates_more_than_the_limit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, extra = ledger_for_kind(kind, tmp_path, request)
    async with quota_env(tmp_path, url, **extra) as env:
        statuses = []
        for i in range(15):
            status, _ = await env.send(
                "POST",
                SERVERS,
                {"metadata": {"name": f"s{i}"}},
                headers={"Idempotency-Key": "one-key"},
            )
            statuses.append(status)
        stored = await env.stored(SERVERS)
        assert len(stored["items"]) <= 10, statuses
        used, in_progress = await env.usage("servers")
        assert used == len(stored["items"])
        assert in_progress == 0
        # The first create went through; the others used the key for another body.
        assert statuses[0] == 201, statuses
        assert set(statuses[1:]) == {422}, statuses

        # A retry of the very same create is never charged twice: it gets the first
        # answer replayed (DESIGN §7), and the store is not asked again.
        status, body = await env.send(
            "POST", SERVERS, {"metadata": {"name": "s0"}}, headers={"Idempotency-Key": "one-key"}
        )
        assert status == 201, body
        assert body["metadata"]["name"] == "s0"
        assert await env.usage("servers") == (1, 0)


@pytest.mark.parametrize("kind", KINDS)
async def test_retries_of_one_create_stay_within_the_limit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A create retried after it succeeded gets its first answer replayed and is never
    charged again, even once its object is deleted (the key stands for that one
    create); the same create under a new key is checked and charged like any other:
    the ledger always matches the store."""
    url, extra = ledger_for_kind(kind, tmp_path, request)
    async with quota_env(tmp_path, url, **extra) as env:
        for i in range(9):
            status, body = await env.send("POST", SERVERS, {"metadata": {"name": f"f{i}"}})
            assert status == 201, body
        for attempt in range(4):
            async with env.http.post(
                env.url(SERVERS),
                json={"metadata": {"name": "again"}},
                headers={**ALICE, "Idempotency-Key": "retry"},
            ) as r:
                assert r.status == 201, await r.text()
                replayed = r.headers.get("Idempotency-Replayed")
            assert replayed == (None if attempt == 0 else "true")
            assert await env.usage("servers") == (10, 0)
        status, _ = await env.send("DELETE", SERVERS + "/again")
        assert status == 200
        status, body = await env.send(
            "POST", SERVERS, {"metadata": {"name": "again"}}, headers={"Idempotency-Key": "retry"}
        )
        assert status == 201, body  # replayed: nothing made, nothing charged
        assert await env.usage("servers") == (9, 0)
        assert len((await env.stored(SERVERS))["items"]) == 9
        # Under a new key it is a new create: checked and charged.
        for key, want in (("retry-2", 201), ("retry-3", 403)):
            status, body = await env.send(
                "POST",
                SERVERS,
                {"metadata": {"name": f"k-{key}"}},
                headers={"Idempotency-Key": key},
            )
            assert status == want, body
        assert body["reason"] == "QuotaExceeded", body
        assert len((await env.stored(SERVERS))["items"]) == 10
        assert await env.usage("servers") == (10, 0)


@pytest.mark.parametrize("kind", KINDS)
async def test_key_reused_on_another_path_is_422(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, extra = ledger_for_kind(kind, tmp_path, request)
    async with quota_env(tmp_path, url, **extra) as env:
        status, _ = await env.send(
            "POST", CONFIGMAPS, {"metadata": {"name": "cfg"}}, headers={"Idempotency-Key": "k"}
        )
        assert status == 201
        for i in range(3):
            status, body = await env.send(
                "POST", SERVERS, {"metadata": {"name": f"s{i}"}}, headers={"Idempotency-Key": "k"}
            )
            assert status == 422, body
            assert body["kind"] == "Status", body
        assert (await env.stored(SERVERS))["items"] == []
        assert await env.usage("servers") == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
async def test_key_reused_with_another_body_is_422(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, extra = ledger_for_kind(kind, tmp_path, request)
    async with quota_env(tmp_path, url, **extra) as env:
        status, _ = await env.send(
            "POST", PODS, pod("small", cpu="1m"), headers={"Idempotency-Key": "k"}
        )
        assert status == 201
        for body in (pod("small", cpu="500"), pod("big", cpu="500")):
            status, answer = await env.send("POST", PODS, body, headers={"Idempotency-Key": "k"})
            assert status == 422, answer
        assert [p["metadata"]["name"] for p in (await env.stored(PODS))["items"]] == ["small"]
        assert await env.usage("requests.cpu") == ("1m", "0")


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_same_key_one_proceeds_the_other_409(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, extra = ledger_for_kind(kind, tmp_path, request)
    store = processes.start_store(tmp_path)
    gate = Gate(store.url, lambda r: r.method == "POST" and r.path == SERVERS)
    relay = TestServer(gate.app(), host="127.0.0.1")
    await relay.start_server()
    try:
        async with quota_env(
            tmp_path, url, upstream=str(relay.make_url("")).rstrip("/"), store=store, **extra
        ) as env:
            body = {"metadata": {"name": "one"}}
            first = asyncio.create_task(
                env.send("POST", SERVERS, body, headers={"Idempotency-Key": "k"})
            )
            await asyncio.wait_for(gate.held.wait(), 10)
            status, answer = await env.send("POST", SERVERS, body, headers={"Idempotency-Key": "k"})
            assert status == 409, answer
            assert answer["reason"] == "Conflict", answer
            assert await env.usage("servers") == (0, 1)
            gate.open.set()
            status, answer = await asyncio.wait_for(first, 20)
            assert status == 201, answer
            assert await env.usage("servers") == (1, 0)
            assert len((await env.stored(SERVERS))["items"]) == 1
    finally:
        await relay.close()
        store.stop()

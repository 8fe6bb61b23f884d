"""Outcomes the sidecar did not see are settled, never assumed (DESIGN §7).

Found by fault injection: a create the store made was released from the quota when its
answer was lost (a cut connection, a 500 after the write, a 504), so a tenant ended
with twice its limit; a reserve that timed out on a stalled Redis still ran when Redis
resumed and held quota for the whole reservation TTL; an `Idempotency-Key` retry of a
create that had succeeded got 403 once the quota was full.

Real processes: the real store behind a relay that loses chosen answers after the store
acted (tests/rigs/lossy.py), the real sidecar, and for the ledger faults a Redis of the
test's own that it pauses (SIGSTOP/SIGCONT by its PID; the shared 6379 one is never
touched). Every test compares the store's real objects with the ledger's `used` and
`in_progress` once settled: never above the limit, never charged for what was not made.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.rigs import processes
from tests.rigs.lossy import Loss, LossyRelay
from tests.rigs.policies import admin_policy
from tests.rigs.quota import ALICE, SERVERS, QuotaEnv, quota_env
from tests.rigs.redis_topologies import _COMMON, Node, RedisUnavailable, binaries
from tests.rigs.waiting import eventually

LIMIT = 3
POLICY = admin_policy(f"servers: {LIMIT}")


def creates(loss: Loss) -> Any:
    """Lose the answer of every server create; pass everything else."""

    def lose(request: web.Request) -> Loss:
        return loss if request.method == "POST" and request.path.endswith("/servers") else None

    return lose


async def names(env: QuotaEnv) -> list[str]:
    stored = await env.stored(SERVERS)
    return sorted(item["metadata"]["name"] for item in stored["items"])


async def settled(env: QuotaEnv, what: str) -> tuple[int, list[str]]:
    """Wait until nothing is in progress and `used` equals the store's real count."""
    seen: dict[str, Any] = {}

    async def agree() -> bool:
        used, in_progress = await env.usage("servers")
        stored = await names(env)
        seen.update(used=used, in_progress=in_progress, stored=stored)
        return bool(in_progress == 0 and used == len(stored))

    try:
        await eventually(agree, within=20, what=f"{what}: the ledger agrees with the store")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen {seen}") from None
    return int(seen["used"]), list(seen["stored"])


@pytest.mark.parametrize(("loss", "lost_status"), [("drop", 502), ("500", 500), ("hold", 504)])
async def test_lost_answers_never_take_a_tenant_over_its_quota(
    tmp_path: Path, loss: str, lost_status: int
) -> None:
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, creates(loss)) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
                limits={"upstreamReadTimeout": 1},
            ) as env:
                statuses = []
                for i in range(2 * LIMIT + 2):
                    status, body = await env.send("POST", SERVERS, {"metadata": {"name": f"s{i}"}})
                    statuses.append(status)
                    assert status in (lost_status, 403), body
                    if status == 403:
                        assert body["reason"] == "QuotaExceeded", body
                used, stored = await settled(env, f"after {statuses}")
                assert len(stored) <= LIMIT, (statuses, stored)
                assert used == len(stored) == LIMIT, (statuses, stored)
                assert statuses[:LIMIT] == [lost_status] * LIMIT, statuses
                assert relay.acted == LIMIT
    finally:
        store.stop()


async def test_a_lost_answer_of_a_create_the_store_refused_is_released(tmp_path: Path) -> None:
    """The settling read finds no object: the reservation goes, nothing is charged."""
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, creates("500")) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
            ) as env:
                # The store refuses it (a bad name): nothing is made, the answer is lost.
                status, _ = await env.send("POST", SERVERS, {"metadata": {"name": "Bad_Name"}})
                assert status == 500
                used, stored = await settled(env, "a refused create")
                assert (used, stored) == (0, [])
    finally:
        store.stop()


async def test_a_client_that_leaves_mid_create_is_charged_for_what_the_store_made(
    tmp_path: Path,
) -> None:
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, creates("hold")) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
            ) as env:
                leaving = asyncio.create_task(
                    env.send("POST", SERVERS, {"metadata": {"name": "left"}})
                )
                await asyncio.wait_for(relay.lost.wait(), 10)
                leaving.cancel()  # the client goes away while the store's answer is held
                with pytest.raises(asyncio.CancelledError):
                    await leaving
                assert await names(env) == ["left"]
                # Still counted while the outcome is unknown to the sidecar.
                used, in_progress = await env.usage("servers")
                assert used + in_progress == 1, (used, in_progress)
                used, stored = await settled(env, "a create whose client left")
                assert (used, stored) == (1, ["left"])
                relay.release.set()
    finally:
        store.stop()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_an_idempotent_retry_after_success_replays_the_first_answer(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    from tests.rigs.ledgers import ledger_for_kind

    url, extra = ledger_for_kind(kind, tmp_path, request)
    async with quota_env(tmp_path, url, policy=POLICY, **extra) as env:
        key = {"Idempotency-Key": "create-web-1"}
        first_status, first = await env.send("POST", SERVERS, {"metadata": {"name": "web"}}, key)
        assert first_status == 201, first
        for i in range(LIMIT - 1):
            status, body = await env.send("POST", SERVERS, {"metadata": {"name": f"f{i}"}})
            assert status == 201, body
        assert await env.usage("servers") == (LIMIT, 0)
        # The quota is full now; the retry of the create that succeeded gets its answer.
        async with env.http.post(
            env.url(SERVERS), json={"metadata": {"name": "web"}}, headers={**ALICE, **key}
        ) as r:
            assert r.status == 201, await r.text()
            assert r.headers.get("Idempotency-Replayed") == "true"
            assert await r.json() == first
        assert await env.usage("servers") == (LIMIT, 0)
        assert len(await names(env)) == LIMIT
        # The key still never lets another create skip the check.
        status, body = await env.send("POST", SERVERS, {"metadata": {"name": "other"}}, key)
        assert status == 422, body


# -- a Redis ledger that stalls ------------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Node]:
    """A redis-server of this test's own (never the shared one), resumed if paused."""
    try:
        binaries()
    except RedisUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    node = Node("ledger", tmp_path / "redis", list(_COMMON))
    node.start()
    yield node
    if node.proc is not None and node.proc.poll() is None:
        os.kill(node.proc.pid, signal.SIGCONT)
    node.stop()


def pause(node: Node) -> None:
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGSTOP)


def resume(node: Node) -> None:
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGCONT)


async def test_a_reserve_that_timed_out_is_released_when_redis_resumes(
    tmp_path: Path, own_redis: Node
) -> None:
    async with quota_env(
        tmp_path,
        f"redis://127.0.0.1:{own_redis.port}/0",
        policy=POLICY,
        quota={"reservationTtlSeconds": 600},
    ) as env:
        # A connection to the ledger is open (so the reserve below is sent on it and
        # waits in Redis's socket buffer while it is paused).
        status, body = await env.send("POST", SERVERS, {"metadata": {"name": "s0"}})
        assert status == 201, body
        pause(own_redis)
        try:
            status, body = await env.send("POST", SERVERS, {"metadata": {"name": "stalled"}})
            assert status == 503, body
        finally:
            resume(own_redis)
        # The reserve ran when Redis resumed; the sidecar releases it, not the TTL.
        used, stored = await settled(env, "a reserve that timed out")
        assert (used, stored) == (1, ["s0"])
        for i in range(1, LIMIT):
            status, body = await env.send("POST", SERVERS, {"metadata": {"name": f"s{i}"}})
            assert status == 201, body


async def test_a_commit_that_timed_out_is_made_when_redis_resumes(
    tmp_path: Path, own_redis: Node
) -> None:
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, creates("hold")) as relay:
            async with quota_env(
                tmp_path,
                f"redis://127.0.0.1:{own_redis.port}/0",
                upstream=relay.url,
                store=store,
                policy=POLICY,
                quota={"reservationTtlSeconds": 600},
            ) as env:
                first = asyncio.create_task(
                    env.send("POST", SERVERS, {"metadata": {"name": "made"}})
                )
                await asyncio.wait_for(relay.lost.wait(), 10)
                pause(own_redis)  # the store made it; the ledger stalls before the commit
                try:
                    relay.release.set()
                    status, body = await asyncio.wait_for(first, 30)
                    assert status == 201, body
                finally:
                    resume(own_redis)
                used, stored = await settled(env, "a commit that timed out")
                assert (used, stored) == (1, ["made"])
    finally:
        store.stop()

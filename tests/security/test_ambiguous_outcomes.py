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
import yaml
from aiohttp import web

from tests.rigs import processes
from tests.rigs.lossy import Loss, LossyRelay
from tests.rigs.policies import admin_policy
from tests.rigs.quota import ALICE, PODS, SERVERS, QuotaEnv, pod, quota_env
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
    """The settling reads find no object until the settling window has passed: the
    reservation goes, nothing is charged."""
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, creates("500")) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
                quota={"settleAfterSeconds": 1},
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


# -- writes the store makes after the sidecar's settling read ------------------------------
#
# Found by hostile review: an upstream still working on a write the sidecar had given up
# on (a 504, or a client that left) made the object after the sidecar's first settling
# read had found nothing, and that read had released the reservation: a tenant held 4
# servers against a limit of 2 with `used` 0, and pods at 18 cpu against a limit of 8.
# A 404 is not proof that the write will never happen: the reservation (or an update's
# increase) stays until the object is seen, or `quota.settleAfterSeconds` has passed.

LATE = {"X-Test-Hold": "late"}
CPU_POLICY = admin_policy('requests.cpu: "4"')
MERGE = "application/merge-patch+json"


def held_writes(loss: Loss) -> Any:
    """`loss` for the writes (never their dry runs) that carry the LATE header."""

    def lose(request: web.Request) -> Loss:
        write = request.method in ("POST", "PUT", "PATCH") and "dryRun" not in request.query
        return loss if write and request.headers.get("X-Test-Hold") == "late" else None

    return lose


def reads_of(relay: LossyRelay, path: str, since: int = 0) -> int:
    """GETs of `path` the relay passed on (the sidecar's settling reads), from `since`."""
    return sum(1 for method, p in relay.seen[since:] if method == "GET" and p == path)


async def unseen_write(
    env: QuotaEnv,
    relay: LossyRelay,
    ending: str,
    method: str,
    path: str,
    body: Any,
    content_type: str = "application/json",
) -> None:
    """Send a write the relay holds, and end the exchange as `ending` says: the
    sidecar's read timeout (504), or the client going away."""
    held = relay.held
    sending = asyncio.create_task(env.send(method, path, body, LATE, content_type))
    await eventually(lambda: relay.held > held, what=f"{method} {path} held by the relay")
    if ending == "client leaves":
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
    else:
        status, answer = await asyncio.wait_for(sending, 30)
        assert status == 504, answer


async def read_again(
    env: QuotaEnv, relay: LossyRelay, paths: list[str], since: int, resource: str = "servers"
) -> None:
    """Wait until every path was read back (found missing, or unchanged) and read again,
    or until nothing of `resource` is in progress any more (what the sidecar did before
    the fix: release at the first read)."""

    async def done() -> bool:
        if all(reads_of(relay, p, since) >= 2 for p in paths):
            return True
        _, in_progress = await env.usage(resource)
        return str(in_progress) == "0"

    await eventually(done, what=f"settling reads of {paths}")


@pytest.mark.parametrize("ending", ["timeout", "client leaves"])
async def test_a_create_the_store_makes_after_the_settling_read_is_charged(
    tmp_path: Path, ending: str
) -> None:
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, held_writes("late")) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
                limits={"upstreamReadTimeout": 0.5 if ending == "timeout" else 30},
                quota={"settleAfterSeconds": 60},
            ) as env:
                since = len(relay.seen)
                made = [f"late-{i}" for i in range(LIMIT)]
                for name in made:
                    await unseen_write(
                        env, relay, ending, "POST", SERVERS, {"metadata": {"name": name}}
                    )
                # Each was read back and not found (the store has not made it yet)…
                await read_again(env, relay, [f"{SERVERS}/{n}" for n in made], since)
                assert await names(env) == []
                # …and still counts: the upstream may still make it.
                assert await env.usage("servers") == (0, LIMIT)
                status, body = await env.send("POST", SERVERS, {"metadata": {"name": "more"}})
                assert status == 403, body
                assert body["reason"] == "QuotaExceeded", body
                relay.release.set()  # the upstream gets round to the writes
                used, stored = await settled(env, "creates made after the settling read")
                assert (used, stored) == (LIMIT, made)
    finally:
        store.stop()


async def test_an_update_the_store_applies_after_the_settling_read_keeps_its_increase(
    tmp_path: Path,
) -> None:
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, held_writes("late")) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=CPU_POLICY,
                limits={"upstreamReadTimeout": 0.5},
                quota={"settleAfterSeconds": 60},
            ) as env:
                for name in ("p0", "p1"):
                    status, body = await env.send("POST", PODS, pod(name, cpu="1"))
                    assert status == 201, body
                since = len(relay.seen)
                # 1 → 3 cpu: its increase of 2 fills the limit of 4; the store is slow.
                await unseen_write(
                    env, relay, "timeout", "PATCH", f"{PODS}/p0", pod("p0", cpu="3"), MERGE
                )
                await read_again(env, relay, [f"{PODS}/p0"], since, "requests.cpu")
                assert await env.usage("requests.cpu") == ("2", "2")
                # Its increase still counts: another raise is refused.
                status, body = await env.send(
                    "PATCH", f"{PODS}/p1", pod("p1", cpu="2"), content_type=MERGE
                )
                assert status == 403, body
                assert body["reason"] == "QuotaExceeded", body
                relay.release.set()  # the store applies the patch now

                async def agree() -> tuple[str, str] | None:
                    usage = await env.usage("requests.cpu")
                    return usage if usage == ("4", "0") else None

                await eventually(agree, within=20, what="the patch applied late is charged")
                stored = [await env.stored(f"{PODS}/{n}") for n in ("p0", "p1")]
                cpus = [s["spec"]["containers"][0]["resources"]["requests"]["cpu"] for s in stored]
                assert cpus == ["3", "1"]
    finally:
        store.stop()


async def test_a_write_that_never_comes_is_released_once_the_window_has_passed(
    tmp_path: Path,
) -> None:
    """The other side: a reservation whose object never appears is not held for ever."""
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, held_writes("stall")) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
                limits={"upstreamReadTimeout": 0.5},
                quota={"settleAfterSeconds": 1},
            ) as env:
                await unseen_write(
                    env, relay, "timeout", "POST", SERVERS, {"metadata": {"name": "never"}}
                )
                used, stored = await settled(env, "a create that never reached the store")
                assert (used, stored) == (0, [])
    finally:
        store.stop()


async def test_a_restarted_sidecar_keeps_waiting_for_a_late_write(tmp_path: Path) -> None:
    """A process stopped while settling leaves the reservation marked, with the time a
    404 may release it: the next process does not release it at its first 404 either."""
    store = processes.start_store(tmp_path)
    later: processes.Proc | None = None
    try:
        async with LossyRelay(store.url, held_writes("late")) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{tmp_path / 'ledger.db'}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
                limits={"upstreamReadTimeout": 0.5},
                quota={"settleAfterSeconds": 60},
            ) as env:
                path = f"{SERVERS}/late"
                since = len(relay.seen)
                await unseen_write(
                    env, relay, "timeout", "POST", SERVERS, {"metadata": {"name": "late"}}
                )
                await read_again(env, relay, [path], since)
                written = Path(env.sidecar.extra["config"])
                config = yaml.safe_load(await asyncio.to_thread(written.read_text))
                for key in ("listen", "audit"):
                    config.pop(key, None)
                env.sidecar.stop()
                since = len(relay.seen)
                later = env.sidecar = processes.start_sidecar(tmp_path, config, name="later")
                await read_again(env, relay, [path], since)  # the new process's reads
                assert await env.usage("servers") == (0, 1)
                relay.release.set()
                used, stored = await settled(env, "a late write settled by the next process")
                assert (used, stored) == (1, ["late"])
    finally:
        if later is not None:
            later.stop()
        store.stop()


# -- a DELETE while the ledger fails --------------------------------------------------------


async def test_a_delete_while_the_ledger_fails_returns_its_charge_when_it_is_back(
    tmp_path: Path,
) -> None:
    """Found by hostile review: the DELETE answered 200, the store held 1 server, the
    ledger kept charging 2 of 2 and the next create was refused 403."""
    from tests.security.test_ledger_faults import immutable

    db = tmp_path / "ledger.db"
    async with quota_env(tmp_path, f"sqlite:///{db}", policy=POLICY) as env:
        for i in range(LIMIT):
            status, body = await env.send("POST", SERVERS, {"metadata": {"name": f"s{i}"}})
            assert status == 201, body
        with immutable(db):
            status, body = await env.send("DELETE", f"{SERVERS}/s0")
            assert status == 200, body
            assert await names(env) == ["s1", "s2"]
        used, stored = await settled(env, "a delete made while the ledger failed")
        assert (used, stored) == (LIMIT - 1, ["s1", "s2"])
        status, body = await env.send("POST", SERVERS, {"metadata": {"name": "s3"}})
        assert status == 201, body


async def test_a_delete_on_a_stalled_redis_returns_its_charge_once(
    tmp_path: Path, own_redis: Node
) -> None:
    """The delete's script may run when Redis resumes, and is made again: the charge
    comes back once, not twice."""
    async with quota_env(tmp_path, f"redis://127.0.0.1:{own_redis.port}/0", policy=POLICY) as env:
        for i in range(LIMIT):
            status, body = await env.send("POST", SERVERS, {"metadata": {"name": f"s{i}"}})
            assert status == 201, body
        pause(own_redis)
        try:
            status, body = await env.send("DELETE", f"{SERVERS}/s0")
            assert status == 200, body
        finally:
            resume(own_redis)
        used, stored = await settled(env, "a delete made while Redis stalled")
        assert (used, stored) == (LIMIT - 1, ["s1", "s2"])
        for name in ("s3", "s4"):
            status, body = await env.send("POST", SERVERS, {"metadata": {"name": name}})
        assert status == 403, body  # one came back, not two
        assert body["reason"] == "QuotaExceeded", body

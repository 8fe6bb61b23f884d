"""The ledger readiness check writes (DESIGN §9): a ledger that answers reads but takes
no writes shows as degraded in `/readyz`.

Found by fault injection: with the disk under the SQLite ledger full, `/readyz` said
"ledger reachable" (its check only read), while every quota-tracked create was a 503.
Real processes: the real sidecar on a SQLite file whose process may no longer grow any
file (RLIMIT_FSIZE set on the running process with prlimit: a write that needs more
space fails as on a full disk), and on a Redis of the test's own that refuses writes
(maxmemory reached, noeviction) while it still answers PING. `/readyz` stays 200 (the
ledger is not required), its ledger detail says the ledger is unavailable, and it
never names the file path or the Redis URL.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rigs.quota import SERVERS, QuotaEnv, quota_env
from tests.rigs.redis_topologies import _COMMON, Node, RedisUnavailable, binaries
from tests.rigs.waiting import eventually
from tests.security.test_ledger_faults import assert_no_leak, ledger_check, readyz_shows


async def ledger_ok(env: QuotaEnv) -> bool:
    status, check, _ = await ledger_check(env)
    return status == 200 and bool(check["ok"])


async def test_a_sqlite_ledger_that_cannot_grow_shows_in_readyz(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    async with quota_env(tmp_path, f"sqlite:///{db}", audit={"path": "-"}) as env:
        status, body = await env.send("POST", SERVERS, {"metadata": {"name": "before"}})
        assert status == 201, body
        await eventually(lambda: ledger_ok(env), what="the ledger check passes")
        pid = env.sidecar.pid
        limits = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        try:
            # No file of the process may grow any more: the next write needs room.
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, limits[1]))
            text = await readyz_shows(env, "ledger unavailable: ledger write failed")
            assert_no_leak(text, str(tmp_path))
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, limits)
        await eventually(lambda: ledger_ok(env), what="the ledger check passes again")
        status, body = await env.send("POST", SERVERS, {"metadata": {"name": "after"}})
        assert status == 201, body


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Node]:
    try:
        binaries()
    except RedisUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    node = Node("ledger", tmp_path / "redis", list(_COMMON))
    node.start()
    yield node
    node.stop()


async def test_a_redis_ledger_that_refuses_writes_shows_in_readyz(
    tmp_path: Path, own_redis: Node
) -> None:
    url = f"redis://127.0.0.1:{own_redis.port}/0"
    async with quota_env(tmp_path, url) as env:
        await eventually(lambda: ledger_ok(env), what="the ledger check passes")
        own_redis.call("CONFIG", "SET", "maxmemory-policy", "noeviction")
        own_redis.call("CONFIG", "SET", "maxmemory", "1")
        try:
            assert own_redis.answers()  # it still answers PING
            text = await readyz_shows(env, "ledger refuses writes")
            assert_no_leak(text, url)
        finally:
            own_redis.call("CONFIG", "SET", "maxmemory", "0")
        await eventually(lambda: ledger_ok(env), what="the ledger check passes again")

"""Shared fixtures, the one place tests get their rigs from (the code is in tests/rigs/):

- the real-process rig: `procs` (start the real store / sidecar as processes, all stopped
  at teardown), `store` (the real backing store as a process), `stack` (store + sidecar
  with tenants acme and beta, tests/rigs/stack.py);
- the in-process rig: `recording_upstream` (an aiohttp server that records what reaches
  it) and `inprocess_sidecar` (the real `build_app` served in-process in front of an
  upstream, tests/rigs/inprocess.py);
- `fake_clock` (tests/rigs/clock.py) and `ledger` (each backend, on the fake clock);
- the real Redis (`redis_url`, `redis_prefix`: each test on its own keys), the real
  `kubectl` (`kubectl_binary`), and an aiohttp client session (`http`);
- replicated Redis, started once per session (tests/rigs/redis_topologies.py): a six-node
  `redis_cluster` and a `redis_sentinel` set; `topology_prefix` gives a test its own
  keys on them.

Under `CI=true` a missing Redis, redis-server or kubectl fails the test instead of
skipping it."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from sidecar.services.quota.ledger import Ledger
from tests.rigs import inprocess, kube, processes, redis_topologies
from tests.rigs.clock import FakeClock
from tests.rigs.ledgers import BACKENDS, make_ledger, redis_url_for
from tests.rigs.stack import Env, running_env

REDIS_URL = os.environ.get("SIDECAR_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _redis_up() -> bool:
    import redis

    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        client.ping()
        client.close()
        return True
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The real Redis; under CI=true a missing Redis fails the test instead of skipping."""
    if not _redis_up():
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis is not reachable at {REDIS_URL} (CI=true: this is a failure)")
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")
    return REDIS_URL


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards (only its own)."""
    import redis

    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


# Replicated topologies this session started (each once), for `topology_prefix`.
_TOPOLOGIES: list[redis_topologies.Topology] = []
RigT = TypeVar("RigT", redis_topologies.RedisClusterRig, redis_topologies.SentinelRig)


def _running(rig: RigT) -> Iterator[RigT]:
    try:
        redis_topologies.binaries()
    except redis_topologies.RedisUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc} (CI=true: this is a failure)")
        pytest.skip(str(exc))
    redis_topologies.start(rig)
    _TOPOLOGIES.append(rig)
    yield rig
    _TOPOLOGIES.remove(rig)
    rig.stop()


@pytest.fixture(scope="session")
def redis_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[redis_topologies.RedisClusterRig]:
    """A six-node Redis Cluster (three masters, one replica each) on loopback; `.url` is
    its `redis+cluster://` URL. A test that kills a node heals it before it ends."""
    yield from _running(redis_topologies.RedisClusterRig(tmp_path_factory.mktemp("cluster")))


@pytest.fixture(scope="session")
def redis_sentinel(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[redis_topologies.SentinelRig]:
    """A master, a replica and three sentinels on loopback; `.url` is its
    `redis+sentinel://…/mymaster` URL. A test that kills a node heals it before it ends."""
    yield from _running(redis_topologies.SentinelRig(tmp_path_factory.mktemp("sentinel")))


@pytest.fixture
def topology_prefix() -> Iterator[str]:
    """A key prefix of this test's own on the replicated topologies; its keys are
    deleted afterwards from every one that runs (only its own)."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    for rig in _TOPOLOGIES:
        rig.delete(prefix)


@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    """The real kubectl; skips where it is absent, fails under CI=true."""
    return kube.kubectl_binary()


# -- the real-process rig ---------------------------------------------------------------


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[processes.Processes]:
    """Start the real store / sidecar as processes (`procs.store()`, `procs.sidecar(config)`);
    every one is stopped when the test ends."""
    started = processes.Processes(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture
def store(procs: processes.Processes) -> processes.Proc:
    """The real backing store as a process."""
    return procs.store()


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Env]:
    """The real store and sidecar, tenants acme and beta (ns1 each), 5 configmaps/servers
    of quota per tenant (tests/rigs/stack.py; `running_env` for other settings)."""
    async with running_env(tmp_path, limit=5) as env:
        yield env


# -- the in-process rig -----------------------------------------------------------------


@pytest.fixture
async def recording_upstream() -> AsyncIterator[inprocess.RecordingUpstream]:
    """An in-process upstream on 127.0.0.1 that records every request and answers 200."""
    async with inprocess.recording_upstream() as upstream:
        yield upstream


@pytest.fixture
def inprocess_sidecar(tmp_path: Path) -> inprocess.InProcessSidecar:
    """`async with inprocess_sidecar(upstream_url, overrides) as url:` the real sidecar app
    in-process on a random loopback port (test policy, no reload, ledger in tmp_path)."""

    def start(
        upstream: str, overrides: dict[str, Any] | None = None
    ) -> AbstractAsyncContextManager[str]:
        return inprocess.running_sidecar(tmp_path, upstream, overrides)

    return start


# -- clocks and ledgers -----------------------------------------------------------------


@pytest.fixture
def fake_clock() -> FakeClock:
    """A clock that moves only when the test advances it."""
    return FakeClock()


@pytest.fixture(params=BACKENDS)
async def ledger(
    request: pytest.FixtureRequest, tmp_path: Path, fake_clock: FakeClock
) -> AsyncIterator[Ledger]:
    """A ledger of each backend (SQLite in tmp_path; Redis, Redis Cluster and Sentinel
    under this test's own prefix) on `fake_clock`, with a 60 s reservation TTL."""
    if request.param.startswith("redis"):
        url = redis_url_for(request.param, request)
        fixture = "redis_prefix" if request.param == "redis" else "topology_prefix"
        prefix = request.getfixturevalue(fixture)
        led = make_ledger(request.param, tmp_path, fake_clock, redis_url=url, prefix=prefix)
    else:
        led = make_ledger("sqlite", tmp_path, fake_clock)
    yield led
    await led.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session

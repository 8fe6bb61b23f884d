"""Ledgers for tests: a factory for every backend (SQLite in the test's tmp directory;
Redis under the test's own `redis_prefix`, its keys only: the one server on 6379, the
six-node Redis Cluster and the Sentinel set of tests/rigs/redis_topologies.py). Tests
take the `ledger` fixture of tests/conftest.py (one per backend, on the `fake_clock`)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from sidecar.services.quota.ledger import Clock, Ledger
from sidecar.services.quota.redis import RedisLedger
from sidecar.services.quota.sqlite import SqliteLedger

BACKENDS = ["sqlite", "redis", "redis-cluster", "redis-sentinel"]
# The fixture of tests/conftest.py whose `.url` is each replicated topology's URL.
TOPOLOGY_FIXTURES = {"redis-cluster": "redis_cluster", "redis-sentinel": "redis_sentinel"}


def make_ledger(
    kind: str,
    tmp_path: Path,
    clock: Clock,
    ttl: float = 60.0,
    redis_url: str = "",
    prefix: str = "",
) -> Ledger:
    if kind == "sqlite":
        return SqliteLedger(str(tmp_path / f"ledger-{uuid.uuid4().hex[:8]}.db"), ttl, clock)
    return RedisLedger(redis_url, ttl, clock, prefix=prefix)


def redis_url_for(kind: str, request: Any) -> str:
    """The URL of a Redis backend ("redis", "redis-cluster", "redis-sentinel")."""
    if kind in TOPOLOGY_FIXTURES:
        return str(request.getfixturevalue(TOPOLOGY_FIXTURES[kind]).url)
    return str(request.getfixturevalue("redis_url"))


def ledger_for_kind(kind: str, tmp: Path, request: Any) -> tuple[str, dict[str, Any]]:
    """(ledger URL, extra config) for "sqlite" (a file in tmp) or a Redis kind (own prefix)."""
    if kind.startswith("redis"):
        prefix = request.getfixturevalue("redis_prefix" if kind == "redis" else "topology_prefix")
        return redis_url_for(kind, request), {"quota": {"redisPrefix": prefix}}
    return f"sqlite:///{tmp / 'ledger.db'}", {}

"""Ledgers for tests: a factory for either backend (SQLite in the
test's tmp directory; Redis under the test's own `redis_prefix`, its keys only). Tests
take the `ledger` fixture of tests/conftest.py (one per backend, on the `fake_clock`)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from sidecar.quota.ledger import Clock, Ledger
from sidecar.quota.redis import RedisLedger
from sidecar.quota.sqlite import SqliteLedger

BACKENDS = ["sqlite", "redis"]


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


def ledger_for_kind(kind: str, tmp: Path, request: Any) -> tuple[str, dict[str, Any]]:
    """(ledger URL, extra config) for "sqlite" (a file in tmp) or "redis" (own prefix)."""
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return url, {"quota": {"redisPrefix": request.getfixturevalue("redis_prefix")}}
    return f"sqlite:///{tmp / 'ledger.db'}", {}

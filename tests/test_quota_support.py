"""Helpers for the quota tests (no tests here): an injectable clock and a factory for
either ledger backend. Redis uses the conftest `redis_prefix` fixture (own keys only)."""

from __future__ import annotations

import uuid
from pathlib import Path

from sidecar.quota.ledger import Clock, Ledger
from sidecar.quota.redis import RedisLedger
from sidecar.quota.sqlite import SqliteLedger

BACKENDS = ["sqlite", "redis"]


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_ledger(kind: str, tmp_path: Path, clock: Clock, ttl: float = 60.0,
                redis_url: str = "", prefix: str = "") -> Ledger:
    if kind == "sqlite":
        return SqliteLedger(str(tmp_path / f"ledger-{uuid.uuid4().hex[:8]}.db"), ttl, clock)
    return RedisLedger(redis_url, ttl, clock, prefix=prefix)

"""`open_ledger`: the ledger backend a `ledger` URL names. Kept out of `ledger.py` (the
interface), which the backends import. Each backend is imported in its own branch, so
a SQLite ledger never loads redis-py."""

from __future__ import annotations

from sidecar.config.settings import QUOTA_REDIS_PREFIX
from sidecar.services.quota.ledger import Clock, Ledger


def open_ledger(
    url: str, ttl_seconds: float, clock: Clock | None = None, redis_prefix: str = QUOTA_REDIS_PREFIX
) -> Ledger:
    """`sqlite:///path` (relative: `sqlite:///./x.db`), or Redis in any form of
    sidecar/config/redis_url.py: `redis://host:port/db`, `redis+cluster://H:P,H:P`,
    `redis+sentinel://H:P,H:P/SERVICE[/DB]`, `rediss…` for TLS."""
    if url.startswith("sqlite://"):
        from sidecar.services.quota.sqlite import SqliteLedger

        path = url[len("sqlite://") :]
        if path.startswith(("/./", "/../", "//")):
            path = path[1:]
        return SqliteLedger(path or ":memory:", ttl_seconds, clock)
    from sidecar.config.redis_url import SCHEMES

    if url.partition("://")[0].lower() in SCHEMES:
        from sidecar.services.quota.redis import RedisLedger

        return RedisLedger(url, ttl_seconds, clock, prefix=redis_prefix)
    scheme = url.partition(":")[0]  # never the rest: it may hold a password
    raise ValueError(
        f"unknown ledger URL scheme {scheme!r} (expected sqlite:///path, redis://…, "
        "redis+cluster://… or redis+sentinel://…)"
    )

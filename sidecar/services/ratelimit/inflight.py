"""The per-tenant in-flight limit (`maxInFlight`): counts of requests being handled.

One process's count; a request enters before the rest of the chain runs and leaves
when it returns, raises or is cancelled (the stage's `finally`). The map holds only
keys with requests in flight, so it is bounded by the concurrency, not the tenants.
"""

from __future__ import annotations


class InFlight:
    """Requests in flight per key; a key's entry disappears when it drops to zero."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def try_enter(self, key: str, limit: int | None) -> bool:
        current = self.counts.get(key, 0)
        if limit is not None and current >= limit:
            return False
        self.counts[key] = current + 1
        return True

    def enter(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def leave(self, key: str) -> None:
        current = self.counts.get(key, 0) - 1
        if current > 0:
            self.counts[key] = current
        else:
            self.counts.pop(key, None)

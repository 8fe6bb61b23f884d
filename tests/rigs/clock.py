"""An injectable clock: TTLs, token buckets and intervals are tested by advancing it,
never by sleeping. Tests take the `fake_clock` fixture of tests/conftest.py."""

from __future__ import annotations


class FakeClock:
    """A clock that stands still until `advance` moves it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

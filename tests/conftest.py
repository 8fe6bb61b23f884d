"""Shared fixtures: real processes and the real Redis, each test on its own keys."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests import harness

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


@pytest.fixture
def store(tmp_path: Path) -> Iterator[harness.Proc]:
    """The real backing store as a process."""
    proc = harness.start_store(tmp_path)
    yield proc
    proc.stop()


@pytest.fixture
async def http() -> AsyncIterator[object]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        yield session

"""Finding 12 (ledger part): a broken quota ledger is noticed, fails closed, and never
leaks a file path, a URL, a password or driver text (DESIGN §7, §9).

Real processes: the real store and the real sidecar. The SQLite ledger file is deleted,
or made immutable with `chattr +i` (tests run as root, which ignores file modes; the
immutable flag binds root too — skipped where the filesystem has no such flag); the
Redis ledger points at a closed port with a password in its URL.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.rigs import processes
from tests.rigs.quota import SERVERS, QuotaEnv, quota_env
from tests.rigs.waiting import eventually

LEAKS = ("sqlite", "OperationalError", "Traceback", "Errno", "ledger.db")


def assert_no_leak(text: str, *secrets: str) -> None:
    for word in (*LEAKS, *secrets):
        assert word not in text, f"{word!r} leaked: {text}"


async def ledger_check(env: QuotaEnv) -> tuple[int, dict[str, Any], str]:
    async with env.http.get(env.url("/readyz")) as r:
        text = await r.text()
        return r.status, json.loads(text)["checks"]["ledger"], text


async def readyz_shows(env: QuotaEnv, words: str) -> str:
    """Poll /readyz until its ledger check fails naming `words`; the raw body."""
    seen: dict[str, Any] = {}

    async def failing() -> bool:
        status, check, text = await ledger_check(env)
        seen.update(status=status, check=check, text=text)
        return status == 200 and not check["ok"] and words in check["detail"]

    await eventually(failing, what=f"the ledger check fails naming {words!r}: {seen}")
    return str(seen["text"])


async def assert_creates_fail_closed(env: QuotaEnv, *secrets: str) -> None:
    status, body = await env.send("POST", SERVERS, {"metadata": {"name": "after"}})
    assert status == 503, body
    assert body["kind"] == "Status", body
    assert "ledger" in body["message"]
    assert_no_leak(json.dumps(body), str(env.tmp), *secrets)
    assert await env.stored(SERVERS + "/after") is None
    # Reads are not affected.
    status, _ = await env.send("GET", SERVERS)
    assert status == 200


async def test_deleted_sqlite_ledger_fails_closed(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    async with quota_env(tmp_path, f"sqlite:///{db}") as env:
        status, _ = await env.send("POST", SERVERS, {"metadata": {"name": "before"}})
        assert status == 201
        os.remove(db)
        await assert_creates_fail_closed(env)
        # The sidecar neither wrote on into the unlinked file nor made a new empty one
        # (which would forget every tenant's usage).
        assert not db.exists()
        text = await readyz_shows(env, "ledger file missing")
        assert_no_leak(text, str(tmp_path))
        async with env.http.get(
            env.url("/quota/v1/tenants/acme"), headers={"Authorization": "Bearer admin-token"}
        ) as r:
            assert r.status == 503
            assert_no_leak(await r.text(), str(tmp_path))


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    try:
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot set the immutable flag here: {exc}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


async def test_read_only_sqlite_ledger_fails_closed(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    async with quota_env(tmp_path, f"sqlite:///{db}") as env:
        status, _ = await env.send("POST", SERVERS, {"metadata": {"name": "before"}})
        assert status == 201
        with immutable(db):
            await assert_creates_fail_closed(env)
            text = await readyz_shows(env, "read-only")
            assert_no_leak(text, str(tmp_path))
        # Writable again: creates work again, on the same file.
        status, body = await env.send("POST", SERVERS, {"metadata": {"name": "later"}})
        assert status == 201, body
        assert await env.usage("servers") == (2, 0)


async def test_unreachable_redis_ledger_names_no_url_or_password(tmp_path: Path) -> None:
    port = processes.free_port()
    url = f"redis://:s3cret-pw@127.0.0.1:{port}/0"
    async with quota_env(tmp_path, url) as env:
        await assert_creates_fail_closed(env, "s3cret-pw", "redis://", str(port))
        text = await readyz_shows(env, "ledger unavailable: redis 127.0.0.1:")
        assert_no_leak(text, "s3cret-pw", "redis://")
        assert "s3cret-pw" not in env.sidecar.log()

"""SIGTERM with an open watch (DESIGN §9): open watches are closed at once, so the
sidecar exits well within `limits.shutdownGraceSeconds` instead of waiting for the
watch to end (the real sidecar and the real store as processes)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp

from tests.rigs.stack import ALICE, CONFIGMAPS, running_env

GRACE = 10.0
# The contract's bound is the grace period; closing watches at once keeps it far below.
EXIT_WITHIN = 5.0


async def test_sigterm_ends_an_open_watch_and_exits_promptly(tmp_path: Path) -> None:
    async with running_env(tmp_path, limit=5, limits={"shutdownGraceSeconds": GRACE}) as env:
        headers = {"Authorization": f"Bearer {ALICE}"}
        timeout = aiohttp.ClientTimeout(total=60)
        async with env.http.get(
            f"{env.url}{CONFIGMAPS}?watch=true", headers=headers, timeout=timeout
        ) as watch:
            assert watch.status == 200, await watch.text()
            # The watch is open end to end once an event arrives through it.
            status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm1"}})
            assert status == 201, body
            line = await asyncio.wait_for(watch.content.readline(), 10)
            event = json.loads(line)
            assert event["type"] == "ADDED"
            assert event["object"]["metadata"]["name"] == "cm1"

            proc = env.sidecar.proc
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # The stream ends (EOF or a cut connection), without a new event.
            ended = False
            try:
                rest = await asyncio.wait_for(watch.content.read(), EXIT_WITHIN)
                ended = rest == b"" or watch.content.at_eof()
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                ended = True
            assert ended
            code = await asyncio.to_thread(proc.wait, EXIT_WITHIN)
            elapsed = time.monotonic() - started
        assert code == 0, env.sidecar.log()
        assert elapsed < EXIT_WITHIN, f"exit took {elapsed:.1f}s (grace {GRACE}s)"

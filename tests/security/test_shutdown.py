"""SIGTERM ends the process within `limits.shutdownGraceSeconds` + 1 s, even when the
upstream stalls, and leaves what was cut in progress for settling (DESIGN §7, §9).

Found by fault injection: with a 5 s grace and an upstream that never answered, the
process took 14 s to exit after SIGTERM, and requests in flight were cut at about twice
the grace. Real processes: the real store behind a relay that swallows chosen requests
(never forwarded, never answered: tests/rigs/lossy.py "stall"), the real sidecar with a
SQLite ledger. A quota-tracked create and a plain read are in flight when SIGTERM comes;
the process must have exited by the deadline (the time is printed), the create's
reservation must still count (cut, not released: the sidecar cannot know whether the
store made it), and the next process settles it against the store.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import yaml
from aiohttp import web

from sidecar.services.quota.sqlite import SqliteLedger
from tests.rigs import processes
from tests.rigs.lossy import Loss, LossyRelay
from tests.rigs.policies import admin_policy
from tests.rigs.quota import SERVERS, quota_env
from tests.rigs.waiting import eventually

GRACE = 2.0
# What the process may take beyond the deadline on a loaded test machine (the contract
# is grace + 1 s; this bound is a hang guard, the measured time is printed).
SLACK = 1.0
POLICY = admin_policy("servers: 3")


def stall_marked(request: web.Request) -> Loss:
    """The upstream stalls on server creates, on reads of the server `cut` (so the
    sidecar cannot settle it before it exits) and on anything named `stall`."""
    creates = request.method == "POST" and request.path.endswith("/servers")
    return "stall" if creates or request.path.endswith(("/cut", "stall-read")) else None


async def usage(db: Path) -> tuple[int, int]:
    ledger = SqliteLedger(str(db), 300)
    try:
        u = await ledger.usage("acme")
        return u.get_used("", "servers"), u.get_in_progress("", "servers")
    finally:
        await ledger.close()


async def test_sigterm_with_a_stalled_upstream_exits_by_the_deadline(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    store = processes.start_store(tmp_path)
    try:
        async with LossyRelay(store.url, stall_marked) as relay:
            async with quota_env(
                tmp_path,
                f"sqlite:///{db}",
                upstream=relay.url,
                store=store,
                policy=POLICY,
                limits={"shutdownGraceSeconds": GRACE, "upstreamReadTimeout": 60},
                # A create the store never made is released this long after it was cut.
                quota={"settleAfterSeconds": 1},
            ) as env:
                create = asyncio.create_task(
                    env.send("POST", SERVERS, {"metadata": {"name": "cut"}})
                )
                read = asyncio.create_task(env.send("GET", SERVERS + "/stall-read"))
                await eventually(
                    lambda: len(relay.seen) >= 2 and relay.lost.is_set(),
                    what="both requests reached the stalled upstream",
                )
                proc = env.sidecar.proc
                started = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        None, lambda: proc.wait(GRACE + 1 + SLACK)
                    )
                except subprocess.TimeoutExpired:
                    raise AssertionError(
                        f"still running {GRACE + 1 + SLACK} s after SIGTERM (grace {GRACE} s)"
                    ) from None
                took = time.monotonic() - started
                print(f"exited {took:.2f} s after SIGTERM (grace {GRACE} s)")
                assert took <= GRACE + 1 + SLACK
                # Requests in flight were answered or cut, never left hanging.
                for task in (create, read):
                    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
                # Cut, not released: the reservation still counts.
                assert await usage(db) == (0, 1)
                assert (await env.stored(SERVERS))["items"] == []

                config = yaml.safe_load(env.sidecar.extra["config"].read_text())

        # The next process settles it: the store never made it, so it is released.
        config["upstream"] = store.url
        nxt = processes.start_sidecar(tmp_path, config, name="next")
        try:

            async def released() -> bool:
                return await usage(db) == (0, 0)

            await eventually(released, within=30, what="the next process settles the cut create")
        finally:
            nxt.stop()
    finally:
        store.stop()

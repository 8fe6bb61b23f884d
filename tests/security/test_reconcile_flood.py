"""A flood of deletecollections (issue 28, item 2; DESIGN §7): a deletecollection that
deleted nothing starts no reconcile, and however many deletecollections arrive while a
reconcile of their tenant runs, they make exactly one more run after it. Found by a
hostile review: every deletecollection, even one that deleted nothing, started a full
reconcile of the tenant with no de-duplication, each reading every page whole and
keeping every item; 24 over 120 MB of one tenant's configmaps took the sidecar from 73
to 950 MiB and held other tenants' requests for up to 1 s (the memory and latency
figures are the `reconcile-flood` load scenario's, loadtests/reconcile_flood.py).

The real sidecar and the real backing store as processes, a recording relay between
them (tests/rigs/relay.py) that counts the reconcile's list requests and holds the
first one, so a reconcile is known to be running while the others arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from sidecar.cli.launch import ProcessGroup
from tests.rigs import processes
from tests.rigs.relay import RecordingRelay
from tests.rigs.stack import ALICE, CONFIGMAPS, Env, seed, sidecar_config
from tests.rigs.waiting import eventually

NO_OPS = 8
REAL = 6
KEPT = 3
# A reconcile of acme lists every tracked resource in turn: its configmaps page (held
# by the relay while the flood arrives) and its last list, cronjobs.
PAGE = b"/api/v1/tenants/acme/configmaps?limit=500"
LAST = b"/apis/batch/v1/tenants/acme/cronjobs?limit=500"
WITHIN = 15.0  # hang guard


@asynccontextmanager
async def rig(tmp: Path) -> AsyncIterator[tuple[Env, RecordingRelay]]:
    with ProcessGroup() as started:
        store = started.add(processes.start_store(tmp))
        relay = RecordingRelay(store.port)
        await relay.start()
        try:
            config = sidecar_config(tmp, relay.url, limit=100)
            sidecar = started.add(await asyncio.to_thread(processes.start_sidecar, tmp, config))
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                env = Env(sidecar.url, store, http, sidecar)
                await seed(env)
                yield env, relay
        finally:
            relay.let_go()
            await relay.stop()


async def _delete_collection(env: Env, selector: str) -> int:
    """A deletecollection of acme's configmaps in ns1 by `selector`; how many it deleted."""
    status, body = await env.call(ALICE, "DELETE", f"{CONFIGMAPS}?labelSelector={selector}")
    assert status == 200, body
    assert body["kind"] == "Status", body
    deleted = body["details"]["deleted"]
    assert isinstance(deleted, int)
    return deleted


async def test_deletecollections_that_delete_nothing_start_no_reconcile_and_a_flood_makes_one_more_run(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as (env, relay):
        names = [(f"cm-{i}", f"b{i}") for i in range(REAL + 1)]
        names += [(f"keep-{i}", "keep") for i in range(KEPT)]
        for name, batch in names:
            status, body = await env.call(
                ALICE, "POST", CONFIGMAPS, {"metadata": {"name": name, "labels": {"batch": batch}}}
            )
            assert status == 201, body
        assert await env.used("acme", "configmaps") == (str(len(names)), "0")
        relay.hold(PAGE)

        for _ in range(NO_OPS):
            assert await _delete_collection(env, "batch%3Dnone") == 0
        # One that deletes: its reconcile starts and waits at its configmaps page.
        assert await _delete_collection(env, "batch%3Db0") == 1
        await eventually(
            lambda: relay.requests_with(PAGE) >= 1, WITHIN, what="a reconcile is running"
        )
        # The only run: those that deleted nothing started none (before the fix: one each).
        assert relay.requests_with(PAGE) == 1

        # A flood while it runs: each deletes one object, and all of them together ask
        # for one more run.
        for i in range(1, REAL + 1):
            assert await _delete_collection(env, f"batch%3Db{i}") == 1
        assert relay.requests_with(PAGE) == 1
        relay.let_go()
        await eventually(
            lambda: relay.requests_with(LAST) >= 2, WITHIN, what="the second run listed everything"
        )
        assert relay.requests_with(PAGE) == 2, "one more run for the whole flood"

        # That one run saw every delete of the flood: usage is what the store holds.
        async def recounted() -> bool:
            return await env.used("acme", "configmaps") == (str(KEPT), "0")

        await eventually(recounted, WITHIN, what="usage recounted to the objects left")
        assert sorted(await env.stored("acme", "configmaps")) == [f"keep-{i}" for i in range(KEPT)]
        assert relay.requests_with(PAGE) == 2

"""Hostile review of policy objects through the API (issue 30; redteam.md class 8,
"decided on one state, applied on another"): a patch of a Role is judged on the store's
dry-run answer, and the real patch must land on that same version. Here the object
changes between the dry run and the real patch (an interposer in front of the store
makes the change right after answering the dry run): without the pin, bob's harmless
patch (dropping `resourceNames` from a configmaps rule) lands on a rule that now says
`secrets` and grants him every secret. With it the patch is refused (409) and the
stored role is the other writer's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.rigs import processes
from tests.rigs.apipolicy import (
    SYSTEM,
    TOKENS,
    ApiPolicyEnv,
    _send,
    binding,
    ns_path,
    role,
    seed,
)
from tests.rigs.paths import SHIPPED_POLICIES
from tests.rigs.waiting import eventually

SESSION = web.AppKey("session", aiohttp.ClientSession)
ROLES = ns_path("acme", "dev", "roles")
PUBLIC = {
    "apiGroups": [""],
    "resources": ["configmaps"],
    "verbs": ["get"],
    "resourceNames": ["public"],
}
CM_GET = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
WRITE_ROLES = {
    "apiGroups": ["rbac.authorization.k8s.io"],
    "resources": ["roles"],
    "verbs": ["get", "patch"],
}


@asynccontextmanager
async def interposer(store_url: str, on_dry_patch: list[str]) -> AsyncIterator[str]:
    """A pass-through to the store (watches streamed); after answering a dry-run PATCH
    of `ROLES/shared` it rewrites that role straight in the store."""

    handlers: set[asyncio.Task[object]] = set()

    async def handle(request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            return await relay(request)
        finally:
            handlers.discard(task)

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower()
            in ("content-type", "x-remote-user", "x-remote-tenant", "x-remote-group", "accept")
        }
        session: aiohttp.ClientSession = request.app[SESSION]
        async with session.request(
            request.method, store_url + request.raw_path, headers=headers, data=body or None
        ) as up:
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
        if (
            request.method == "PATCH"
            and request.path == ROLES + "/shared"
            and request.query.get("dryRun") == "All"
        ):
            changed = role("shared", [CM_GET, {**PUBLIC, "resources": ["secrets"]}])
            status, _ = await _send(store_url + ROLES + "/shared", "PUT", dict(SYSTEM), changed)
            on_dry_patch.append(str(status))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_ctx)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for task in list(handlers):  # the watches it still relays
            task.cancel()
        await runner.cleanup()


async def test_a_role_patch_lands_on_the_version_it_was_judged_on(
    tmp_path: Path, procs: processes.Processes
) -> None:
    store = procs.store()
    changes: list[str] = []
    async with interposer(store.url, changes) as url:
        tokens = processes.write_tokens(tmp_path, TOKENS)
        config = {
            "upstream": url,
            "policies": str(SHIPPED_POLICIES),
            "identity": {"tokenFile": str(tokens)},
            "apiPolicy": {"retrySeconds": 0.2},
        }
        # The sidecar process runs while this test's loop serves the interposer.
        sidecar = await asyncio.to_thread(procs.sidecar, config)
        env = ApiPolicyEnv(tmp_path, procs, store, [sidecar], [config])
        await seed(env)
        # amy (no grant from the files) may patch roles and read configmaps.
        created = await env.call("alice", "POST", ROLES, role("bob-rights", [WRITE_ROLES, CM_GET]))
        assert created[0] == 201, created
        status, _ = await env.call(
            "alice",
            "POST",
            ns_path("acme", "dev", "rolebindings"),
            binding("b", "Role", "bob-rights", "amy"),
        )
        assert status == 201
        assert (await env.call("alice", "POST", ROLES, role("shared", [CM_GET, PUBLIC])))[0] == 201

        async def may_patch() -> bool:
            return (await env.call("amy", "GET", ROLES + "/shared"))[0] == 200

        await eventually(may_patch, 5, "amy's grant")
        status, answer = await env.call(
            "amy",
            "PATCH",
            ROLES + "/shared",
            [{"op": "remove", "path": "/rules/1/resourceNames"}],
            content_type="application/json-patch+json",
        )
        assert changes == ["200"]  # the role did change between the dry run and the patch
        # The store refuses the patch whose precondition failed (409 for a merge
        # patch's resourceVersion, 422 for a JSON patch's failed `test`).
        assert status in (409, 422), answer
        assert answer["code"] == 409 or "tested value" in answer["message"], answer
        _, stored = await env.store_call("GET", ROLES + "/shared")
        assert stored["rules"][1] == {**PUBLIC, "resources": ["secrets"]}, json.dumps(stored)
        # Without a change in between, a patch is judged and applied as usual.
        status, answer = await env.call(
            "amy",
            "PATCH",
            ROLES + "/bob-rights",
            {"rules": [WRITE_ROLES, CM_GET]},
            content_type="application/merge-patch+json",
        )
        assert status == 200, answer
        await asyncio.to_thread(sidecar.stop)  # its watches through the interposer end


async def test_a_refused_dry_run_is_never_followed_by_the_real_write(
    tmp_path: Path, procs: processes.Processes
) -> None:
    """A patch whose precondition names the version the role will have after another
    write: its dry run is refused (409), and the interposer's write then makes the
    precondition true. Forwarding the real patch after a refused dry run would apply it
    unjudged (secrets for amy); it must not be sent."""
    store = procs.store()
    changes: list[str] = []
    async with interposer(store.url, changes) as url:
        tokens = processes.write_tokens(tmp_path, TOKENS)
        config = {
            "upstream": url,
            "policies": str(SHIPPED_POLICIES),
            "identity": {"tokenFile": str(tokens)},
            "apiPolicy": {"retrySeconds": 0.2},
        }
        sidecar = await asyncio.to_thread(procs.sidecar, config)
        env = ApiPolicyEnv(tmp_path, procs, store, [sidecar], [config])
        await seed(env)
        created = await env.call("alice", "POST", ROLES, role("bob-rights", [WRITE_ROLES, CM_GET]))
        assert created[0] == 201, created
        status, _ = await env.call(
            "alice",
            "POST",
            ns_path("acme", "dev", "rolebindings"),
            binding("b", "Role", "bob-rights", "amy"),
        )
        assert status == 201
        assert (await env.call("alice", "POST", ROLES, role("shared", [CM_GET, PUBLIC])))[0] == 201

        async def may_patch() -> bool:
            return (await env.call("amy", "GET", ROLES + "/shared"))[0] == 200

        await eventually(may_patch, 5, "amy's grant")
        _, listed = await env.store_call("GET", ROLES)
        next_rv = str(int(listed["metadata"]["resourceVersion"]) + 1)
        secrets = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
        status, answer = await env.call(
            "amy",
            "PATCH",
            ROLES + "/shared",
            {"metadata": {"resourceVersion": next_rv}, "rules": secrets},
            content_type="application/merge-patch+json",
        )
        assert changes == ["200"]  # the interposer's write made the precondition true
        assert status == 409, answer
        _, stored = await env.store_call("GET", ROLES + "/shared")
        assert stored["metadata"]["resourceVersion"] == next_rv
        assert stored["rules"] != secrets, stored
        await asyncio.to_thread(sidecar.stop)

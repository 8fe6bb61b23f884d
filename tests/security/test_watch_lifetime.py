"""Watches follow the policy (issue 21, part 4; DESIGN §4, §5): an open watch is decided
again on every policy swap and ended at once when refused; it ends when its credential
goes (a static token removed from the token file, a JWT whose `exp` passes); and no
watch outlives `limits.maxWatchSeconds` (each drawing its own limit between 1 and 2 times).
An ended watch ends cleanly (its chunked answer is terminated, so the client sees the
watch end and re-watches) and never delivers an event after its end.

The real sidecar and the real backing store as processes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.rigs import processes
from tests.rigs.tokens import SECRET, claims, hs256
from tests.rigs.waiting import eventually

ADMIN_POLICY = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
- {nonResourceURLs: ["*"], verbs: ["*"]}
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: admin}]
---
kind: ClusterRole
metadata: {name: configmap-reader}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch]}
"""
READERS = """\
---
kind: TenantRoleBinding
metadata: {name: readers, tenant: acme}
roleRef: {kind: ClusterRole, name: configmap-reader}
subjects: [{kind: User, name: wanda}, {kind: User, name: jay}]
"""
TOKENS = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "wanda-token", "user": "wanda", "tenant": "acme", "groups": []},
]
CONFIGMAPS = "/api/v1/tenants/acme/namespaces/default/configmaps"
# Hang guards only: what is checked is that the watch ends, not how fast.
ENDS_WITHIN = 10.0


@dataclass
class Rig:
    url: str
    sidecar: processes.Proc
    http: aiohttp.ClientSession
    policy_file: Path
    token_file: Path

    async def call(self, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        async with self.http.request(method, self.url + path, data=data, headers=headers) as resp:
            raw = await resp.read()
        return resp.status, json.loads(raw) if raw else None

    async def create(self, name: str) -> None:
        status, body = await self.call("admin", "POST", CONFIGMAPS, {"metadata": {"name": name}})
        assert status == 201, body

    async def watch(self, token: str) -> aiohttp.ClientResponse:
        resp = await self.http.get(
            self.url + CONFIGMAPS + "?watch=true",
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        assert resp.status == 200, await resp.text()
        return resp

    async def live(self, watch: aiohttp.ClientResponse, name: str) -> None:
        """The watch is open end to end: an object created now arrives through it."""
        await self.create(name)
        line = await asyncio.wait_for(watch.content.readline(), ENDS_WITHIN)
        event = json.loads(line)
        assert event["type"] == "ADDED", event
        assert event["object"]["metadata"]["name"] == name


async def ends_cleanly(watch: aiohttp.ClientResponse) -> bytes:
    """The rest of the watch, read to its end: a terminated chunked answer (a cut
    connection raises ClientPayloadError). Fails if it does not end in time."""
    return await asyncio.wait_for(watch.content.read(), ENDS_WITHIN)


@asynccontextmanager
async def rig(tmp: Path, **config: Any) -> AsyncIterator[Rig]:
    policies = tmp / "policies"
    policies.mkdir()
    policy_file = policies / "policy.yaml"
    policy_file.write_text(ADMIN_POLICY + READERS)
    token_file = processes.write_tokens(tmp, TOKENS)
    store = await asyncio.to_thread(processes.start_store, tmp)
    try:
        settings: dict[str, Any] = {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {
                "tokenFile": str(token_file),
                "jwt": {"secret": SECRET, "algorithms": ["HS256"]},
            },
            "reload": {"enabled": True, "debounceSeconds": 0.1, "pollSeconds": 0.2},
            "limits": {"shutdownGraceSeconds": 2},
        }
        settings.update(config)
        sidecar = await asyncio.to_thread(processes.start_sidecar, tmp, settings)
        try:
            async with aiohttp.ClientSession() as http:
                r = Rig(sidecar.url, sidecar, http, policy_file, token_file)
                status, body = await r.call(
                    "admin", "POST", "/api/v1/tenants", {"metadata": {"name": "acme"}}
                )
                assert status == 201, body
                yield r
        finally:
            await asyncio.to_thread(sidecar.stop)
    finally:
        await asyncio.to_thread(store.stop)


async def test_watch_ends_when_the_policy_revokes_it(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        watch = await r.watch("wanda-token")
        await r.live(watch, "before")

        # The operator removes wanda's grant; the reload swaps it in.
        r.policy_file.write_text(ADMIN_POLICY)

        async def refused() -> bool:
            status, _ = await r.call("wanda-token", "GET", CONFIGMAPS)
            return status == 403

        await eventually(refused, ENDS_WITHIN, what="the new policy is in force")
        await r.create("after-revoke")
        rest = await ends_cleanly(watch)
        assert b"after-revoke" not in rest
        await eventually(
            lambda: "no longer allows it" in r.sidecar.log(), ENDS_WITHIN, what="the end is logged"
        )
        # Re-watching gets the refusal.
        async with r.http.get(
            r.url + CONFIGMAPS + "?watch=true", headers={"Authorization": "Bearer wanda-token"}
        ) as again:
            assert again.status == 403


async def test_watch_lives_on_when_the_policy_still_allows_it(tmp_path: Path) -> None:
    """A swap that keeps the grant does not end the watch (the recheck is a decision,
    not a blanket reset)."""
    async with rig(tmp_path) as r:
        watch = await r.watch("wanda-token")
        await r.live(watch, "first")

        async def revision() -> str:
            async with r.http.get(r.url + "/readyz") as resp:
                detail: str = (await resp.json())["checks"]["policy"]["detail"]
            return detail.split()[1]  # "revision R in force since …"

        first = await revision()
        extra = (
            "---\nkind: ClusterRole\nmetadata: {name: unrelated}\n"
            "rules:\n- {apiGroups: [''], resources: [pods], verbs: [get]}\n"
        )
        r.policy_file.write_text(ADMIN_POLICY + READERS + extra)

        async def swapped() -> bool:
            return await revision() != first

        await eventually(swapped, ENDS_WITHIN, what="the new revision is in force")
        await r.live(watch, "second")
        await r.live(watch, "third")
        assert "ending a watch" not in r.sidecar.log()
        watch.close()


async def test_watch_ends_when_its_token_is_removed(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        watch = await r.watch("wanda-token")
        await r.live(watch, "before")

        r.token_file.write_text(yaml.safe_dump([TOKENS[0]]))

        async def gone() -> bool:
            status, _ = await r.call("wanda-token", "GET", CONFIGMAPS)
            return status == 401

        await eventually(gone, ENDS_WITHIN, what="the token file is reloaded")
        await r.create("after-removal")
        rest = await ends_cleanly(watch)
        assert b"after-removal" not in rest


async def test_watch_ends_when_its_jwt_expires(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        lifetime = 4
        payload = claims("jay", "acme", [], lifetime=lifetime, iss=None, aud=None)
        token = hs256(payload)
        watch = await r.watch(token)
        await r.live(watch, "before")
        await ends_cleanly(watch)
        # Not before the token's exp (whole seconds; the sidecar's clock is this one).
        assert time.time() >= payload["exp"] - 1
        status, _ = await r.call(token, "GET", CONFIGMAPS)
        assert status == 401


async def test_watch_ends_within_max_watch_seconds(tmp_path: Path) -> None:
    async with rig(tmp_path, limits={"maxWatchSeconds": 1, "shutdownGraceSeconds": 2}) as r:
        started = time.monotonic()
        watches = [await r.watch("wanda-token") for _ in range(3)]
        for watch in watches:
            await ends_cleanly(watch)
            # Each watch's limit is drawn between 1 and 2 times of maxWatchSeconds; the
            # upper bound is checked with an injected random source in
            # tests/sidecar/edge/test_watches.py, here only the hang guard holds it.
            assert time.monotonic() - started >= 1.0
        # The client re-watches, and gets a new watch.
        again = await r.watch("wanda-token")
        again.close()

"""The many-tenants flood generator (loadtests/many_tenants.py), against an in-process
aiohttp server: one request per tenant, each with the trusted front-proxy headers the
sidecar believes from 127.0.0.1, every answer counted, tenants cycled when fewer."""

from __future__ import annotations

from collections import Counter

from aiohttp import web

from loadtests.many_tenants import FLOOD_GROUP, flood, tenant_name
from sidecar.core.target import is_dns1123_label


async def test_flood_sends_one_request_per_tenant_with_its_headers() -> None:
    seen: list[tuple[str, str, str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        h = request.headers
        seen.append((request.path, h["X-Remote-Tenant"], h["X-Remote-User"], h["X-Remote-Group"]))
        return web.Response(status=403 if len(seen) % 2 else 200)

    app = web.Application()
    app.router.add_get("/t/{tenant}/x", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        distinct = await flood(
            "127.0.0.1", port, "/t/{tenant}/x", start=500, count=300, distinct=300, rate=1e9
        )
        cycled = await flood(
            "127.0.0.1", port, "/t/{tenant}/x", start=0, count=90, distinct=30, rate=1e9
        )
    finally:
        await runner.cleanup()
    assert (distinct.sent, distinct.errors) == (300, 0)
    assert distinct.statuses == Counter({403: 150, 200: 150})
    first = seen[:300]
    assert sorted(t for _, t, _, _ in first) == sorted(tenant_name(i) for i in range(500, 800))
    assert all(path == f"/t/{t}/x" and g == FLOOD_GROUP for path, t, _u, g in first)
    assert all(is_dns1123_label(t) for _, t, _, _ in first)
    assert sum(cycled.statuses.values()) == 90
    assert Counter(t for _, t, _, _ in seen[300:]) == {tenant_name(i): 3 for i in range(30)}

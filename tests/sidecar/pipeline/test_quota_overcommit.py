"""Issue 28, defence in depth: an update's commit never books more than was reserved.

The stand-in store answers the real write with an object charged more than its dry run
said (an upstream that applied the write to another state than it dry-ran): the sidecar
books the charge it reserved, counts `sidecar_quota_overcommit_total`, logs it, and
reconciles the tenant at once (the single-flight reconcile reads the store's list)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.app import METRICS_KEY
from tests.rigs.waiting import eventually
from tests.sidecar.pipeline.test_quota import (
    ALICE,
    SERVERS,
    Store,
    create,
    http,  # noqa: F401 (a fixture)
    server_body,
    show,
    sidecar,  # noqa: F401 (a fixture)
    u,
    versioned,
)


class Diverging(Store):
    """Dry runs of a PATCH answer `updated`; the real write answers `stored`."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: dict[str, Any] | None = None

    async def any(self, request: web.Request) -> web.Response:
        if request.method == "PATCH" and "dryRun" not in request.query and self.stored:
            self.seen.append((request.method, request.raw_path, await request.read(), {}))
            return web.json_response(self.stored)
        return await super().any(request)


@pytest.fixture
async def store() -> AsyncIterator[tuple[Store, TestServer]]:
    s = Diverging()
    server = TestServer(s.app(), host="127.0.0.1")
    await server.start_server()
    yield s, server
    await server.close()


def overcommits(server: TestServer, resource: str) -> float:
    value = server.app[METRICS_KEY].registry.get_sample_value(
        "sidecar_quota_overcommit_total", {"tenant": "acme", "resource": resource}
    )
    return value or 0.0


async def test_a_commit_books_no_more_than_was_reserved(
    sidecar: TestServer,  # noqa: F811 (the fixture)
    http: aiohttp.ClientSession,  # noqa: F811 (the fixture)
    store: tuple[Store, TestServer],
) -> None:
    fake = store[0]
    assert isinstance(fake, Diverging)
    assert (await create(http, sidecar, server_body("p", "100m")))[0] == 201
    fake.updated = versioned(server_body("p", "300m"), "5")
    fake.stored = versioned(server_body("p", "900m"), "6")
    fake.seen.clear()
    headers = {**ALICE, "Content-Type": "application/merge-patch+json"}
    async with http.patch(u(sidecar, SERVERS + "/p"), data=b"{}", headers=headers) as r:
        assert r.status == 200, await r.text()  # the write happened: its answer
    assert overcommits(sidecar, "requests.cpu") == 1
    assert overcommits(sidecar, "servers") == 0
    q = await show(http, sidecar)
    # booked as reserved (300m), not as the store answered (900m)
    assert (q["requests.cpu"]["used"], q["requests.cpu"]["in_progress"]) == ("300m", "0")

    def reconciled() -> bool:
        return any(m == "GET" and p.split("?")[0].endswith("/servers") for m, p, *_ in fake.seen)

    await eventually(reconciled, what="a reconcile of acme reading the store's list")


async def test_a_commit_within_the_reservation_is_not_an_overcommit(
    sidecar: TestServer,  # noqa: F811 (the fixture)
    http: aiohttp.ClientSession,  # noqa: F811 (the fixture)
    store: tuple[Store, TestServer],
) -> None:
    fake = store[0]
    assert isinstance(fake, Diverging)
    assert (await create(http, sidecar, server_body("p", "100m")))[0] == 201
    fake.updated = versioned(server_body("p", "300m"), "5")
    fake.stored = versioned(server_body("p", "200m"), "6")  # less: booked as stored
    headers = {**ALICE, "Content-Type": "application/merge-patch+json"}
    async with http.patch(u(sidecar, SERVERS + "/p"), data=b"{}", headers=headers) as r:
        assert r.status == 200, await r.text()
    assert overcommits(sidecar, "requests.cpu") == 0
    assert (await show(http, sidecar))["requests.cpu"]["used"] == "200m"

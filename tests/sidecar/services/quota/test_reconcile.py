"""Quota reconcile (sidecar/services/quota/reconcile.py): pages read as a stream of items
(only what the ledger needs kept), reconciles single-flight per tenant, and the rule that
says whether a deletecollection deleted something.

The streamed page reader itself (`Upstream.get_items`) against an in-process upstream:
items handed over one at a time across pages, and answers that are no list refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.config.settings import load_config
from sidecar.core.status import StatusError
from sidecar.edge.proxy import Upstream
from sidecar.services.metrics import Metrics
from sidecar.services.quota.ledger import Ledger
from sidecar.services.quota.reconcile import (
    RECONCILER,
    Item,
    Reconciles,
    StoreReader,
    deleted_something,
    reconcile,
    upstream_fetch,
)
from tests.rigs.clock import FakeClock
from tests.rigs.ledgers import make_ledger
from tests.rigs.waiting import eventually

# -- deletecollection answers -------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "deleted"),
    [
        # Kubernetes answers the deleted objects.
        (b'{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[]}', False),
        (b'{"kind":"ConfigMapList","items":null}', False),
        (b'{"kind":"ConfigMapList","items":[{"metadata":{"name":"a"}}]}', True),
        # The reference store answers a Status with the count.
        (
            b'{"kind":"Status","status":"Success","details":{"kind":"configmaps","deleted":0}}',
            False,
        ),
        (b'{"kind":"Status","status":"Success","details":{"kind":"configmaps","deleted":2}}', True),
        # Anything that does not say is taken as a delete: the recount is never skipped
        # on a guess.
        (b'{"kind":"Status","status":"Success"}', True),
        (b'{"kind":"Status","details":{"deleted":"0"}}', True),
        (b'{"kind":"Status","details":{"deleted":false}}', True),
        (b'{"kind":"Other","details":{"deleted":0}}', True),
        (b"[]", True),
        (b"not json", True),
        (b"\xff\xfe", True),
        (None, True),  # a streamed answer, never held whole
    ],
)
def test_a_deletecollection_deleted_something_only_when_its_answer_says_so(
    answer: bytes | None, deleted: bool
) -> None:
    assert deleted_something(answer) is deleted


# -- reconcile over a stream of items ----------------------------------------------------


class Pages:
    """A store stand-in: configmaps in pages of `per_page`, handed over one item at a
    time; every other resource empty. `gate`: the first configmaps page waits for it."""

    def __init__(self, items: list[dict[str, Any]], per_page: int = 2) -> None:
        self.items = items
        self.per_page = per_page
        self.calls: list[tuple[str, list[tuple[str, str]]]] = []
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()

    async def page(
        self, path: str, query: list[tuple[str, str]], item: Item
    ) -> tuple[int, dict[str, Any]]:
        self.calls.append((path, query))
        if not path.endswith("/configmaps"):
            return 200, {"metadata": {}}
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        start = int(dict(query).get("continue", "0"))
        for value in self.items[start : start + self.per_page]:
            item(value)
        more = start + self.per_page < len(self.items)
        return 200, {"metadata": {"continue": str(start + self.per_page) if more else ""}}

    async def get(self, path: str) -> tuple[int, Any]:
        return 404, None

    def reader(self) -> StoreReader:
        return StoreReader(self.page, self.get)

    def runs(self) -> int:
        return sum(
            1 for path, query in self.calls if path.endswith("/configmaps") and len(query) == 1
        )


def _configmap(tenant: str, name: str) -> dict[str, Any]:
    return {"metadata": {"tenant": tenant, "namespace": "ns1", "name": name}, "data": {"x": "y"}}


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    led = make_ledger("sqlite", tmp_path, FakeClock())
    yield led
    await led.close()


async def test_a_reconcile_counts_every_item_of_every_page(ledger: Ledger) -> None:
    items = [_configmap("acme", f"cm-{i}") for i in range(5)]
    items.insert(2, _configmap("beta", "theirs"))  # another tenant's: not acme's
    items.insert(4, {"metadata": "not an object"})  # unreadable: skipped
    pages = Pages(items)
    results = await reconcile(ledger, pages.reader(), "acme")
    assert results["acme"].after.get("configmaps") == 5
    # Three pages of configmaps, each asked for with the last page's continue token.
    configmaps = [q for p, q in pages.calls if p == "/api/v1/tenants/acme/configmaps"]
    assert configmaps == [
        [("limit", "500")],
        [("limit", "500"), ("continue", "2")],
        [("limit", "500"), ("continue", "4")],
        [("limit", "500"), ("continue", "6")],
    ]


async def test_reconciles_of_a_tenant_run_one_at_a_time_and_a_flood_makes_one_more_run(
    ledger: Ledger,
) -> None:
    pages = Pages([_configmap("acme", "cm-0")])
    pages.gate = asyncio.Event()
    reconciles = Reconciles(pages.reader(), ledger)
    reconciles.request("acme")
    await asyncio.wait_for(pages.waiting.wait(), 5)  # hang guard
    for _ in range(24):
        reconciles.request("acme")
    assert pages.runs() == 1
    assert reconciles.runs == 1
    pages.gate.set()
    await eventually(lambda: not reconciles.running("acme"), 5, what="the runs ended")
    assert reconciles.runs == 2
    assert pages.runs() == 2
    await reconciles.stop()


async def test_a_request_after_a_run_ended_starts_a_new_one(ledger: Ledger) -> None:
    pages = Pages([_configmap("acme", "cm-0")])
    reconciles = Reconciles(pages.reader(), ledger)
    for expected in (1, 2):
        reconciles.request("acme")
        await eventually(lambda: not reconciles.running("acme"), 5, what="the run ended")
        assert reconciles.runs == expected
    await reconciles.stop()


async def test_stop_cancels_a_running_reconcile(ledger: Ledger) -> None:
    pages = Pages([_configmap("acme", "cm-0")])
    pages.gate = asyncio.Event()
    reconciles = Reconciles(pages.reader(), ledger)
    reconciles.request("acme")
    reconciles.request("beta")  # another tenant's runs alongside
    await asyncio.wait_for(pages.waiting.wait(), 5)
    assert reconciles.running("acme")
    assert reconciles.running("beta")
    await reconciles.stop()
    assert not reconciles.running("acme")
    assert not reconciles.running("beta")


# -- the streamed page reader: Upstream.get_items -------------------------------------------


@pytest.fixture
async def lists() -> AsyncIterator[tuple[Upstream, dict[str, bytes]]]:
    """An upstream answering each path with the bytes set for it (404 otherwise), and
    the sidecar's Upstream in front of it."""
    answers: dict[str, bytes] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = answers.get(request.path_qs)
        if body is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(body), 1000):  # in small pieces
            await response.write(body[start : start + 1000])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    config = load_config(overrides={"upstream": f"http://127.0.0.1:{server.port}"})
    upstream = Upstream(config, Metrics())
    try:
        yield upstream, answers
    finally:
        await upstream.close()
        await server.close()


async def test_items_are_handed_over_one_at_a_time(
    lists: tuple[Upstream, dict[str, bytes]],
) -> None:
    upstream, answers = lists
    items = [{"metadata": {"name": f"cm-{i}"}, "data": {"pad": "x" * 5000}} for i in range(40)]
    answers["/api/v1/configmaps?limit=500"] = json.dumps(
        {"kind": "ConfigMapList", "metadata": {"continue": "next"}, "items": items}
    ).encode()
    seen: list[Any] = []
    status, fields = await upstream.get_items(
        "/api/v1/configmaps", RECONCILER, [("limit", "500")], seen.append
    )
    assert status == 200
    assert seen == items
    assert fields["metadata"] == {"continue": "next"}
    assert "kind" in fields


async def test_a_missing_list_is_its_status_and_nothing_else(
    lists: tuple[Upstream, dict[str, bytes]],
) -> None:
    upstream, _ = lists
    seen: list[Any] = []
    assert await upstream.get_items("/apis/x/v1/things", RECONCILER, [], seen.append) == (404, {})
    assert seen == []


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind":"Status","code":200}',  # no items array
        b'{"kind":"ConfigMapList","items":null}',
        b"[]",
        b'{"kind":"ConfigMapList","items":[{"metadata":',  # cut short
        b'{"kind":"ConfigMapList","items":[]} trailing',
    ],
)
async def test_an_answer_that_is_not_a_whole_list_is_a_502(
    lists: tuple[Upstream, dict[str, bytes]], body: bytes
) -> None:
    """A reconcile never takes an answer it cannot read for an empty page (which would
    drop the tenant's recorded objects)."""
    upstream, answers = lists
    answers["/api/v1/configmaps"] = body
    with pytest.raises(StatusError) as raised:
        await upstream.get_items("/api/v1/configmaps", RECONCILER, [], lambda _item: None)
    assert raised.value.code == 502


async def test_a_reconcile_through_the_upstream_charges_what_the_store_holds(
    lists: tuple[Upstream, dict[str, bytes]], ledger: Ledger
) -> None:
    """Streamed pages give numbers as the parser reads them (`0.5` as a Decimal): the
    charge is the same as for the parsed document. Resources the store does not serve
    (404 here) are left as they are."""
    upstream, answers = lists
    pods = [
        {
            "metadata": {"tenant": "acme", "namespace": "ns1", "name": f"p{i}"},
            "spec": {"containers": [{"resources": {"requests": {"cpu": 0.5, "memory": "1Gi"}}}]},
        }
        for i in range(3)
    ]
    answers["/api/v1/tenants/acme/pods?limit=500"] = json.dumps(
        {"kind": "PodList", "metadata": {}, "items": pods}
    ).encode()
    results = await reconcile(ledger, upstream_fetch(upstream), "acme")
    assert results["acme"].after == {
        "pods": 3,
        "requests.cpu": 1500,
        "requests.memory": 3 * 1024**3,
    }

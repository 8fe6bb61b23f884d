"""The watch relay (sidecar/edge/watches.py).

SIGTERM with an open watch (DESIGN §9): open watches are closed at once, so the
sidecar exits well within `limits.shutdownGraceSeconds` instead of waiting for the
watch to end (the real sidecar and the real store as processes). In process: each watch
draws its own lifetime (an injected random source), an exchange whose client left ends
as a client reset with only the forwarding cancelled, and a watch past its lifetime
before its answer started is refused."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any, cast
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from sidecar.core.status import StatusError
from sidecar.core.target import parse_target
from sidecar.edge.watches import Exchange, WatchRelay, watch_lifetime
from sidecar.pipeline.context import RequestContext
from tests.rigs.stack import ALICE, CONFIGMAPS, running_env
from tests.rigs.waiting import eventually

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


# -- the relay's own rules, in process -------------------------------------------------


def _ctx(query: str, transport: Any = None) -> RequestContext:
    path = "/api/v1/tenants/acme/namespaces/default/pods"
    if transport is None:
        transport = mock.Mock()
        transport.is_closing.return_value = False
    request = make_mocked_request("GET", f"{path}?{query}", transport=transport)
    ctx = RequestContext(
        request=request, request_id="r1", policy=cast(Any, None), max_body_bytes=1024
    )
    ctx.target = parse_target("GET", path, query)
    return ctx


def test_a_watch_lifetime_is_drawn_between_once_and_twice_the_limit() -> None:
    draws = iter([0.0, 0.5, 0.999999])
    lifetimes = [watch_lifetime(1800, lambda: next(draws)) for _ in range(3)]
    assert lifetimes == pytest.approx([1800.0, 2700.0, 3600.0], abs=0.01)


async def test_each_watch_draws_its_own_lifetime() -> None:
    draws = [0.25, 0.75]
    relay = WatchRelay(8, max_watch_seconds=100, draw=lambda: draws.pop(0))
    release = asyncio.Event()

    async def forward(ctx: RequestContext, exchange: Exchange) -> web.StreamResponse:
        await release.wait()
        return web.Response()

    # A list is not a watch: it draws nothing.
    listed = asyncio.create_task(relay.run(_ctx("limit=1"), forward))
    watches = [asyncio.create_task(relay.run(_ctx("watch=true"), forward)) for _ in range(2)]
    await eventually(lambda: len(relay.watches) == 2 and len(relay.exchanges) == 3, 5)
    assert sorted(w.lifetime for w in relay.watches.values()) == [125.0, 175.0]
    assert draws == []
    release.set()
    await asyncio.gather(listed, *watches)
    assert not relay.watches
    assert not relay.exchanges
    await relay.close()


async def test_an_exchange_whose_client_left_ends_as_a_client_reset() -> None:
    """Only the forwarding is cancelled, and the cancellation is taken back: what runs
    around it (a quota release, the audit line) runs in a task that is not cancelled."""
    transport = mock.Mock()
    transport.is_closing.return_value = False
    relay = WatchRelay(8, poll_seconds=0.01)
    inside = asyncio.Event()
    cancelled_inside: list[bool] = []

    async def forward(ctx: RequestContext, exchange: Exchange) -> web.StreamResponse:
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled_inside.append(True)
            raise
        return web.Response()

    async def handler() -> str:
        try:
            await relay.run(_ctx("limit=1", transport), forward)
        except ConnectionResetError:
            await asyncio.sleep(0)  # what runs after it is not cancelled
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0
            return "reset"
        return "answered"

    task = asyncio.create_task(handler())
    await asyncio.wait_for(inside.wait(), 5)
    transport.is_closing.return_value = True  # the client hangs up
    assert await asyncio.wait_for(task, 5) == "reset"
    assert cancelled_inside == [True]
    assert not relay.exchanges
    await relay.close()


async def test_a_watch_past_its_lifetime_before_its_answer_is_refused() -> None:
    transport = mock.Mock()
    transport.is_closing.return_value = False
    relay = WatchRelay(8, max_watch_seconds=0.01, poll_seconds=0.01)

    async def forward(ctx: RequestContext, exchange: Exchange) -> web.StreamResponse:
        await asyncio.Event().wait()  # the upstream never answers
        return web.Response()

    with pytest.raises(StatusError) as refused:
        await asyncio.wait_for(relay.run(_ctx("watch=true", transport), forward), 5)
    assert refused.value.code == 504
    assert not relay.watches
    await relay.close()


async def test_a_closed_connection_lets_its_exchange_go_at_once() -> None:
    """`sidecar serve`'s connections tell the relay of their own end: the exchange is let
    go by that callback, not by the poller (here too slow to ever look)."""
    from sidecar.edge.write_deadline import DeadlineServer, WriteDeadlines

    relay = WatchRelay(8, poll_seconds=3600)
    inside = asyncio.Event()
    outcome: list[str] = []

    async def forward(ctx: RequestContext, exchange: Exchange) -> web.StreamResponse:
        inside.set()
        await asyncio.Event().wait()
        return web.Response()

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        path = "/api/v1/tenants/acme/namespaces/default/pods"
        ctx = RequestContext(
            request=cast(web.Request, request),
            request_id="r1",
            policy=cast(Any, None),
            max_body_bytes=1024,
        )
        ctx.target = parse_target("GET", path, "limit=1")
        try:
            return await relay.run(ctx, forward)
        except ConnectionResetError:
            outcome.append("reset")
            raise

    deadlines = WriteDeadlines(60.0)
    server = DeadlineServer(handler, deadlines)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(inside.wait(), 5)
        writer.transport.abort()  # the client hangs up
        await eventually(lambda: outcome == ["reset"] and not relay.exchanges, 5)
    finally:
        listener.close()
        await server.shutdown(1.0)
        await deadlines.close()
        await relay.close()

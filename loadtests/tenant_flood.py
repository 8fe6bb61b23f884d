"""The many-tenants flood: requests of many distinct tenants, as fast as a fixed schedule.

One process sends `count` requests, request `i` as tenant `tenant_name(i % distinct)`,
at `rate` per second on `connections` keep-alive connections (each connection sends
its next request when the last is answered, no earlier than its due time
t0 + i/rate). The identity is the trusted front-proxy headers (`X-Remote-User`,
`X-Remote-Tenant`, `X-Remote-Group`, DESIGN §4), which the sidecar believes from
127.0.0.1: a new tenant costs the client one formatted string, where a JWT or a
static token per tenant would cost a signature or a token file a million lines long.
Requests are written as bytes and answers parsed by httptools, so the client spends
a small part of a core on a million requests.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import cast

import httptools

FLOOD_GROUP = "flooders"


def tenant_name(i: int) -> str:
    """The i-th flood tenant: a DNS-1123 label, distinct for every i."""
    return f"f{i:07d}"


@dataclass
class FloodResult:
    sent: int = 0
    seconds: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    errors: int = 0
    # Answer latencies in ms of every 16th request (enough for percentiles).
    latency_sample: list[float] = field(default_factory=list)


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError("connection closed"))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.parser.get_status_code())

    def ask(self, request: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter


async def flood(
    host: str,
    port: int,
    path_of: str,
    *,
    start: int,
    count: int,
    distinct: int,
    rate: float,
    connections: int = 16,
) -> FloodResult:
    """Send `count` requests (GET `path_of.format(tenant=…)`) of tenants
    `start + i % distinct`; see the module docstring."""
    loop = asyncio.get_running_loop()
    result = FloodResult()
    counter = itertools.count()
    t0 = time.perf_counter()
    head = f"Host: {host}:{port}\r\nX-Remote-User: flood\r\nX-Remote-Group: {FLOOD_GROUP}\r\n"

    async def worker() -> None:
        conn: _Conn | None = None
        while True:
            i = next(counter)
            if i >= count:
                break
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tenant = tenant_name(start + i % distinct)
            request = (
                f"GET {path_of.format(tenant=tenant)} HTTP/1.1\r\n{head}"
                f"X-Remote-Tenant: {tenant}\r\n\r\n"
            ).encode()
            sent = time.perf_counter()
            try:
                if conn is None:
                    _, conn = await loop.create_connection(_Conn, host, port)
                status = await asyncio.wait_for(conn.ask(request), 30)
            except (OSError, ConnectionError, TimeoutError):
                result.errors += 1
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
                conn = None
                continue
            result.statuses[status] += 1
            if not i % 16:
                result.latency_sample.append((time.perf_counter() - sent) * 1000)
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    result.seconds = time.perf_counter() - t0
    result.sent = count
    return result


def run_flood(
    host: str,
    port: int,
    path_of: str,
    *,
    start: int,
    count: int,
    distinct: int,
    rate: float,
    connections: int = 16,
) -> FloodResult:
    """`flood` on its own event loop (uvloop when installed), for a child process."""
    coro = flood(
        host,
        port,
        path_of,
        start=start,
        count=count,
        distinct=distinct,
        rate=rate,
        connections=connections,
    )
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)

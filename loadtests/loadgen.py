"""The aiohttp load generators: an open-loop one at an exact rate, a closed-loop one.

Locust schedules users, not requests, so its offered rate drifts with latency; the
`limits` and `noisy-neighbour` scenarios need an exact offered rate per tenant, so
they use `open_loop`: each stream fires its requests on a fixed schedule
(t0 + i/rate), never waiting for earlier answers. `closed_loop` keeps a fixed number
of requests in flight for the benchmark. Both return one `Record` per request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

# (method, url, headers, json body or None)
RequestSpec = tuple[str, str, dict[str, str], Any]


@dataclass(slots=True)
class Record:
    t: float  # seconds since the run started, when the request was sent
    stream: str  # usually the tenant
    phase: str
    status: int  # 0 = transport error
    latency_ms: float
    retry_after: str
    error: str = ""
    reason: str = ""  # the Status body's `reason` of an error answer


@dataclass
class Stream:
    """One tenant's offered load: `rate` requests/s built by `make`, from `start` for
    `duration` seconds (relative to the run's start)."""

    name: str
    rate: float
    make: Callable[[int], RequestSpec]
    start: float = 0.0
    duration: float = 10.0
    phase: str = "main"


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def send_one(
    session: aiohttp.ClientSession,
    spec: RequestSpec,
    stream: str,
    phase: str,
    t0: float,
    out: list[Record],
) -> None:
    method, url, headers, body = spec
    sent = time.perf_counter()
    try:
        async with session.request(method, url, headers=headers, json=body) as resp:
            data = await resp.read()
            status = resp.status
            retry = resp.headers.get("Retry-After", "")
        err = ""
    except (TimeoutError, aiohttp.ClientError) as exc:
        status, retry, err, data = 0, "", type(exc).__name__, b""
    done = time.perf_counter()
    out.append(
        Record(
            sent - t0,
            stream,
            phase,
            status,
            (done - sent) * 1000,
            retry,
            err,
            _reason(data) if status >= 400 else "",
        )
    )


def _reason(data: bytes) -> str:
    try:
        body = json.loads(data)
    except ValueError:
        return ""
    return str(body.get("reason") or "") if isinstance(body, dict) else ""


async def open_loop(
    streams: list[Stream],
    session: aiohttp.ClientSession | None = None,
) -> list[Record]:
    """Run every stream on its fixed schedule; return after the last answer."""
    own = session is None
    session = session or new_session()
    out: list[Record] = []
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()

    async def drive(s: Stream) -> None:
        interval = 1.0 / s.rate
        begin = t0 + s.start
        for i in itertools.count():
            due = begin + i * interval
            if due - begin >= s.duration:
                return
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send_one(session, s.make(i), s.name, s.phase, t0, out))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    try:
        await asyncio.gather(*(drive(s) for s in streams))
        if tasks:
            await asyncio.wait(list(tasks), timeout=35)
    finally:
        if own:
            await session.close()
    return out


async def closed_loop(
    make: Callable[[int], RequestSpec],
    concurrency: int,
    seconds: float,
    name: str = "bench",
    warmup: float = 0.5,
) -> tuple[list[Record], float]:
    """`concurrency` workers each send the next request as soon as the last is
    answered. Returns the records after the warm-up and the measured seconds."""
    out: list[Record] = []
    counter = itertools.count()
    async with new_session(limit=concurrency) as session:
        t0 = time.perf_counter()
        measure_from = t0 + warmup
        stop = measure_from + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                await send_one(session, make(next(counter)), name, "main", t0, out)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    kept = [r for r in out if r.t >= warmup]
    return kept, seconds

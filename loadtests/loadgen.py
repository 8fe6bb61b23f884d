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
import multiprocessing
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
    t0: float | None = None,
) -> list[Record]:
    """Run every stream on its fixed schedule; return after the last answer. `t0`: the
    schedule's origin on the `time.perf_counter` clock (default: now)."""
    own = session is None
    session = session or new_session()
    out: list[Record] = []
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter() if t0 is None else t0

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


def open_loop_in_processes(groups: list[list[Stream]], lead: float = 1.0) -> list[Record]:
    """`open_loop` with each group of streams in a process of its own, all on one
    schedule starting `lead` seconds from now (`perf_counter` is the system's
    monotonic clock, the same in every process). A flood's client then has its own
    CPU, as it would on its own machine: its cost never shows up as the latency of
    the quiet tenant's client. Linux (fork)."""
    ctx = multiprocessing.get_context("fork")
    t0 = time.perf_counter() + lead
    queue: multiprocessing.Queue[list[Record]] = ctx.Queue()
    procs = [ctx.Process(target=_run_group, args=(group, t0, queue)) for group in groups]
    for proc in procs:
        proc.start()
    try:
        longest = max(s.start + s.duration for group in groups for s in group)
        records: list[Record] = []
        for _ in procs:
            records += queue.get(timeout=lead + longest + 60)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return sorted(records, key=lambda r: r.t)


def _run_group(group: list[Stream], t0: float, queue: multiprocessing.Queue[list[Record]]) -> None:
    queue.put(asyncio.run(open_loop(group, t0=t0)))


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

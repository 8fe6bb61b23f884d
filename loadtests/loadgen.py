"""The load generators: an open-loop one at an exact rate, a closed-loop one.

Locust schedules users, not requests, so its offered rate drifts with latency; the
`limits` and `noisy-neighbour` scenarios need an exact offered rate per tenant, so
they use `open_loop`: each stream fires its requests on a fixed schedule
(t0 + i/rate), never waiting for earlier answers. `closed_loop` keeps a fixed number
of requests in flight for the benchmark. Both return one `Record` per request.

A stream with `lean=True` is driven by `open_loop_lean` instead of aiohttp's client:
the same schedule and records, over plain keep-alive connections (asyncio protocols,
answers parsed by httptools), at a fraction of the client CPU per request. It is for
floods: a noisy tenant offering thousands of requests a second through aiohttp's
client would spend most of a core of this 2-core machine on its own side, and that
CPU, taken from the sidecar and the quiet tenant's client, would show up in the
latency the scenario measures as if the sidecar had caused it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import httptools
from yarl import URL

from loadtests import lifecycle

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
    # Drive it with `open_loop_lean` (plain connections) when its group runs alone.
    lean: bool = False


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
    start = time.perf_counter() if t0 is None else t0
    try:
        await _on_schedule(
            streams,
            start,
            lambda s, i: send_one(session, s.make(i), s.name, s.phase, start, out),
        )
    finally:
        if own:
            await session.close()
    return out


async def _on_schedule(
    streams: list[Stream], t0: float, fire: Callable[[Stream, int], Coroutine[Any, Any, None]]
) -> None:
    """Start `fire(stream, i)` for each stream's i-th request at t0 + start + i/rate,
    never waiting for earlier answers; return once the last has ended (at most 35 s
    after the schedule)."""
    tasks: set[asyncio.Task[None]] = set()
    if streams:
        end = t0 + max(s.start + s.duration for s in streams)
        lifecycle.note(f"load: {len(streams)} stream(s)", end - time.perf_counter())

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
            task = asyncio.create_task(fire(s, i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    await asyncio.gather(*(drive(s) for s in streams))
    if tasks:
        await asyncio.wait(list(tasks), timeout=35)


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
        streams = sum(len(group) for group in groups)
        lifecycle.note(f"load: {streams} stream(s) in {len(procs)} processes", lead + longest)
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
    if all(s.lean for s in group):
        try:
            import uvloop

            queue.put(uvloop.run(open_loop_lean(group, t0=t0)))
        except ImportError:
            queue.put(asyncio.run(open_loop_lean(group, t0=t0)))
        return
    queue.put(asyncio.run(open_loop(group, t0=t0)))


class Exchange(asyncio.Protocol):
    """One keep-alive connection to one host: one request at a time, its answer
    parsed by httptools. `ask` sends a request and returns a future of
    (status, Retry-After, body); a connection that breaks fails it with ConnectionError."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, str, bytes]] | None = None
        self.retry = ""
        self.body: list[bytes] = []
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(ConnectionError("connection closed"))

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            status = self.parser.get_status_code()
            self.waiter.set_result((status, self.retry, b"".join(self.body)))

    def ask(self, request: bytes) -> asyncio.Future[tuple[int, str, bytes]]:
        assert self.transport is not None
        self.retry, self.body = "", []
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter


def _request_bytes(spec: RequestSpec) -> tuple[tuple[str, int], bytes]:
    method, url, headers, body = spec
    u = URL(url)
    payload = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {u.raw_path_qs} HTTP/1.1", f"Host: {u.host}:{u.port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append("Content-Type: application/json")
    if body is not None or method not in ("GET", "HEAD", "DELETE"):
        lines.append(f"Content-Length: {len(payload)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return (u.host or "127.0.0.1", u.port or 80), head + payload


async def open_loop_lean(streams: list[Stream], t0: float | None = None) -> list[Record]:
    """`open_loop` over plain keep-alive connections (see the module docstring): each
    request goes out at its due time on an idle connection to its host, or on a new
    one when none is idle (as aiohttp's unlimited connector does); answers read whole."""
    loop = asyncio.get_running_loop()
    out: list[Record] = []
    idle: dict[tuple[str, int], list[Exchange]] = {}
    t0 = time.perf_counter() if t0 is None else t0

    async def one(spec: RequestSpec, stream: str, phase: str) -> None:
        sent = time.perf_counter()
        address, request = _request_bytes(spec)
        status, retry, err, data = 0, "", "", b""
        conn: Exchange | None = None
        try:
            conn = take_idle(address)
            try:
                if conn is None:
                    _, conn = await loop.create_connection(Exchange, *address)
                    reused = False
                else:
                    reused = True
                status, retry, data = await asyncio.wait_for(conn.ask(request), 30)
            except (ConnectionError, RuntimeError):
                if not reused or conn is None:
                    raise
                # The server closed this idle connection as the request went out (an
                # HTTP client retries that once on a new connection).
                conn.reusable = False
                if conn.transport is not None:
                    conn.transport.close()
                _, conn = await loop.create_connection(Exchange, *address)
                status, retry, data = await asyncio.wait_for(conn.ask(request), 30)
        except Exception as exc:  # every request gets its record, answered or not
            err = type(exc).__name__
        done = time.perf_counter()
        if conn is not None:
            if not err and conn.reusable:
                idle.setdefault(address, []).append(conn)
            elif conn.transport is not None:
                conn.transport.close()
        reason = _reason(data) if status >= 400 else ""
        out.append(
            Record(sent - t0, stream, phase, status, (done - sent) * 1000, retry, err, reason)
        )

    def take_idle(address: tuple[str, int]) -> Exchange | None:
        """An idle connection the server has not closed (a server closes idle
        keep-alive connections after its timeout, as the sidecar does)."""
        free = idle.get(address)
        while free:
            conn = free.pop()
            if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    try:
        await _on_schedule(streams, t0, lambda s, i: one(s.make(i), s.name, s.phase))
    finally:
        for conns in idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
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

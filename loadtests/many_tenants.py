"""The `many-tenants` scenario (DESIGN §11 "Memory"): a million distinct tenants, one
request each, then a steady tenant's read p99 compared with its p99 at 1,000 tenants,
and the sidecar's resident memory along the way.

Phases, one sidecar process (`--workers` does not apply: the figures are one
process's), rate limits on for every tenant (a `"*"` `RateLimit`, so every flood
tenant gets a bucket), audit written to /dev/null (formatted and written, not kept):

1. **1k**: a flood cycling through 1,000 tenants at `FLOOD_RATE` requests/s for
   `--seconds`, while the steady tenant reads its server at `STEADY_RATE`/s;
2. **fill**: new tenants, one request each, as fast as the sidecar answers them (16
   connections), until `--tenants` distinct tenants have been seen; resident memory
   is read after every tenth of them;
3. **after**: new tenants again (every request still a tenant never seen), at the
   1k phase's rate and for as long, with the steady tenant reading as in phase 1.

Targets: the steady tenant's p99 in phase 3 within 1.5x of phase 1, every one of its
reads answered 200; resident memory flat: at the end at most 10% above its value once
the bounded caches (`rateLimit.maxBuckets`, `cache.decisions`, 100,000 each) are full,
i.e. after 200,000 tenants (n/a for smaller runs).

The flood's identity is the trusted front-proxy headers (`X-Remote-User`,
`X-Remote-Tenant`, `X-Remote-Group`, DESIGN §4), believed from 127.0.0.1: a new tenant
costs the client one formatted string, where a JWT or a static token per tenant would
cost a signature or a token file a million lines long. Flood tenants have no role
binding: each request is charged to its own tenant's bucket and then refused (403)
without an upstream call, as a flood of made-up tenants would be. The flood's client
writes requests as bytes on `loadgen.Exchange` connections (answers parsed by
httptools), in a process of its own, as does the steady tenant's client (aiohttp).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtests import report
from loadtests.loadgen import Exchange, Record, Stream, open_loop
from loadtests.report import percentile
from loadtests.stack import (
    Proc,
    Stack,
    member_policies,
    rate_limit_doc,
    seed_server,
    seed_tenant,
    servers_path,
)

if TYPE_CHECKING:
    from loadtests.scenarios import Options

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
        conn: Exchange | None = None
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
                    _, conn = await loop.create_connection(Exchange, host, port)
                status, _retry, _body = await asyncio.wait_for(conn.ask(request), 30)
            except (OSError, ConnectionError, TimeoutError):
                result.errors += 1
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
                conn = None
                continue
            if not conn.reusable:  # the server closes it after this answer
                if conn.transport is not None:
                    conn.transport.close()
                conn = None
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


# ------------------------------------------------------------------------- scenario

FLOOD_RATE = 1000.0  # requests/s of the flood in the measured phases (x --scale)
STEADY_RATE = 25.0  # the steady tenant's reads per second
WARM_TENANTS = 1_000
CACHES_FULL_AFTER = 200_000  # tenants: twice the default maxBuckets and cache.decisions
FLAT_WITHIN = 1.10
P99_WITHIN = 1.5
STEADY = "steady"


@dataclass
class Phase:
    name: str
    flood: FloodResult
    steady: list[Record]
    cpu_seconds: float  # the sidecar's CPU time during the phase
    rss_mib: float  # the sidecar's resident memory after it


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux /proc), MiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _flood_child(args: tuple[Any, ...], queue: multiprocessing.Queue[FloodResult]) -> None:
    host, port, path_of, start, count, distinct, rate = args
    queue.put(
        run_flood(host, port, path_of, start=start, count=count, distinct=distinct, rate=rate)
    )


def _steady_child(url: str, seconds: float, queue: multiprocessing.Queue[list[Record]]) -> None:
    path = url + servers_path(STEADY) + "/web-0"
    headers = {"X-Remote-User": "sam", "X-Remote-Tenant": STEADY, "X-Remote-Group": "members"}
    stream = Stream(STEADY, STEADY_RATE, lambda _i: ("GET", path, headers, None), 0, seconds)
    queue.put(asyncio.run(open_loop([stream])))


def _phase(
    name: str,
    sidecar: Proc,
    *,
    start: int,
    count: int,
    distinct: int,
    rate: float,
    steady_seconds: float = 0.0,
) -> Phase:
    """One flood (and the steady tenant's reads for `steady_seconds`), each client in
    a process of its own."""
    pid = sidecar.proc.pid
    ctx = multiprocessing.get_context("fork")
    floods: multiprocessing.Queue[FloodResult] = ctx.Queue()
    steadies: multiprocessing.Queue[list[Record]] = ctx.Queue()
    path_of = servers_path("{tenant}") + "/web-0"
    procs = [
        ctx.Process(
            target=_flood_child,
            args=(("127.0.0.1", sidecar.port, path_of, start, count, distinct, rate), floods),
        )
    ]
    if steady_seconds:
        procs.append(
            ctx.Process(target=_steady_child, args=(sidecar.url, steady_seconds, steadies))
        )
    cpu0 = cpu_seconds(pid)
    for proc in procs:
        proc.start()
    try:
        # A fill runs as fast as the sidecar answers: at worst ~500/s on a busy machine.
        result = floods.get(timeout=count / min(rate, 500.0) + 120)
        records = steadies.get(timeout=steady_seconds + 60) if steady_seconds else []
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    cpu = cpu_seconds(pid) - cpu0
    for r in records:
        r.phase = name
    return Phase(name, result, records, cpu, rss_mib(pid))


def many_tenants(out: Path, opts: Options) -> tuple[str, bool]:
    seconds, scale = opts.seconds, opts.scale
    total = max(3 * WARM_TENANTS, opts.tenants or round(1_000_000 * scale))
    rate = max(50.0, FLOOD_RATE * scale)
    after_count = round(rate * seconds)
    fill_total = max(0, total - WARM_TENANTS - after_count)
    memory: list[tuple[int, float]] = []  # (distinct tenants seen, RSS MiB)
    with Stack(out / "work-many-tenants") as stack:
        store = stack.start_store()
        seed_tenant(store.url, STEADY)
        seed_server(store.url, STEADY, "web-0")
        policies = stack.write_policies([*member_policies([STEADY]), rate_limit_doc("*", 100, 200)])
        config = {
            "upstream": store.url,
            "policies": str(policies),
            "ledger": f"sqlite:///{stack.work / 'ledger.db'}",
            "identity": {"trustedHeaders": {"enabled": True, "clients": ["127.0.0.1"]}},
            "audit": {"path": "/dev/null"},
        }
        sidecar = stack.start_sidecar(config)
        memory.append((0, rss_mib(sidecar.proc.pid)))
        warm = _phase(
            "1k",
            sidecar,
            start=0,
            count=after_count,
            distinct=WARM_TENANTS,
            rate=rate,
            steady_seconds=seconds,
        )
        memory.append((WARM_TENANTS, warm.rss_mib))
        fills: list[Phase] = []
        seen = WARM_TENANTS
        chunk = max(1, math.ceil(fill_total / 10))
        while seen < WARM_TENANTS + fill_total:
            count = min(chunk, WARM_TENANTS + fill_total - seen)
            fills.append(
                _phase("fill", sidecar, start=seen, count=count, distinct=count, rate=math.inf)
            )
            seen += count
            memory.append((seen, fills[-1].rss_mib))
        after = _phase(
            "after",
            sidecar,
            start=seen,
            count=after_count,
            distinct=after_count,
            rate=rate,
            steady_seconds=seconds,
        )
        seen += after_count
        memory.append((seen, after.rss_mib))

    # ------------------------------------------------------------------ figures
    def steady_stats(phase: Phase) -> dict[str, Any]:
        ok = [r.latency_ms for r in phase.steady if r.status == 200]
        return {
            "requests": len(phase.steady),
            "ok": len(ok),
            "p50_ms": percentile(ok, 50),
            "p99_ms": percentile(ok, 99),
            "max_ms": max(ok) if ok else math.nan,
        }

    fill = FloodResult()
    fill_cpu = 0.0
    for f in fills:
        fill.sent += f.flood.sent
        fill.seconds += f.flood.seconds
        fill.statuses.update(f.flood.statuses)
        fill.errors += f.flood.errors
        fill.latency_sample += f.flood.latency_sample
        fill_cpu += f.cpu_seconds
    phases = [
        (warm, WARM_TENANTS),
        (Phase("fill", fill, [], fill_cpu, fills[-1].rss_mib if fills else math.nan), fill.sent),
        (after, after_count),
    ]
    rows: list[dict[str, Any]] = []
    for phase, tenants in phases:
        flood_res = phase.flood
        row: dict[str, Any] = {
            "phase": phase.name,
            "flood_tenants": tenants,
            "flood_requests": flood_res.sent,
            "flood_per_s": flood_res.sent / flood_res.seconds if flood_res.seconds else math.nan,
            "flood_statuses": " ".join(f"{k}:{v}" for k, v in sorted(flood_res.statuses.items())),
            "flood_errors": flood_res.errors,
            "flood_p99_ms": percentile(flood_res.latency_sample, 99),
            "sidecar_cpu_us_per_request": phase.cpu_seconds
            / max(1, flood_res.sent + len(phase.steady))
            * 1e6,
            "rss_mib_after": phase.rss_mib,
        }
        if phase.steady:
            row.update({f"steady_{k}": v for k, v in steady_stats(phase).items()})
        rows.append(row)
    a, b = steady_stats(warm), steady_stats(after)
    ratio = b["p99_ms"] / a["p99_ms"] if a["p99_ms"] else math.nan
    all_ok = a["ok"] == a["requests"] > 0 and b["ok"] == b["requests"] > 0
    p99_ok = report.meets(ratio, "<=", P99_WITHIN, ".2f")  # as printed below
    full = next((rss for n, rss in memory if n >= CACHES_FULL_AFTER), None)
    end_rss = memory[-1][1]
    flat = end_rss / full if full else math.nan
    flat_ok = full is None or report.meets(flat, "<=", FLAT_WITHIN, ".2f")

    report.write_rows(out / "many-tenants.csv", rows)
    report.write_rows(
        out / "many-tenants-memory.csv",
        [{"tenants_seen": n, "rss_mib": rss} for n, rss in memory],
    )
    report.write_records(out / "many-tenants-requests.csv", warm.steady + after.steady)
    for r in after.steady:  # one time line for the chart: phase 3 after phase 1
        r.stream = f"{STEADY} after {seen:,} tenants"
    for r in warm.steady:
        r.stream = f"{STEADY} at 1k tenants"
    report.chart_latency(
        out / "many-tenants-latency.png",
        warm.steady + after.steady,
        "many-tenants: the steady tenant's reads (same offered load in both phases)",
        [
            warm.steady[0].stream if warm.steady else "",
            after.steady[0].stream if after.steady else "",
        ],
    )
    report.chart_bars(
        out / "many-tenants-memory.png",
        [f"{n:,}" for n, _ in memory],
        {"sidecar RSS": [rss for _, rss in memory]},
        "many-tenants: sidecar resident memory by distinct tenants seen",
        "MiB",
    )

    lines = [
        f"{seen:,} distinct tenants in all. Phase 1k: a flood over {WARM_TENANTS:,} tenants "
        f"at {rate:g}/s for {seconds:g} s; fill: {fill.sent:,} new tenants, one request each, "
        f"as fast as answered; after: {after_count:,} new tenants at {rate:g}/s for "
        f"{seconds:g} s. The steady tenant reads at {STEADY_RATE:g}/s in 1k and after. "
        "One sidecar process; flood tenants are refused (403, no upstream call) after "
        "their rate-limit bucket is charged.",
        "",
        f"{'phase':6} {'flood/s':>8} {'flood p99':>9} {'cpu/req':>8} {'RSS MiB':>8}   "
        f"{'steady ok':>10} {'p50ms':>6} {'p99ms':>6} {'maxms':>6}",
    ]
    for row in rows:
        steady_part = (
            f"{row['steady_ok']:>4}/{row['steady_requests']:<5} {row['steady_p50_ms']:6.2f} "
            f"{row['steady_p99_ms']:6.2f} {row['steady_max_ms']:6.1f}"
            if "steady_ok" in row
            else "(not measured)"
        )
        lines.append(
            f"{row['phase']:6} {row['flood_per_s']:8.0f} {row['flood_p99_ms']:7.1f}ms "
            f"{row['sidecar_cpu_us_per_request']:6.0f}us {row['rss_mib_after']:8.1f}   "
            f"{steady_part}"
        )
    lines += [
        "",
        "sidecar RSS (MiB) by distinct tenants seen: "
        + ", ".join(f"{n:,}: {rss:.0f}" for n, rss in memory),
        "",
        f"steady tenant: every read answered 200: {_verdict(all_ok)}",
        f"steady p99 after {seen:,} tenants / at 1k tenants = {ratio:.2f} "
        f"(target <= {P99_WITHIN:g}): {_verdict(p99_ok)}",
        (
            f"memory flat: {end_rss:.0f} MiB at the end against {full:.0f} MiB once the "
            f"caches were full ({CACHES_FULL_AFTER:,} tenants) = {flat:.2f}x "
            f"(target <= {FLAT_WITHIN:g}x): "
            f"{_verdict(flat_ok)}"
            if full is not None
            else f"memory flat: n/a (fewer than {CACHES_FULL_AFTER:,} tenants: the "
            "caches never filled)"
        ),
    ]
    ok = all_ok and p99_ok and flat_ok
    lines += ["", f"overall: {_verdict(ok)}"]
    text = report.write_summary(out / "many-tenants-summary.txt", "scenario: many-tenants", lines)
    return text, ok


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"

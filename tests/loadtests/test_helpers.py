"""The load-test helpers: wrk output parsing, percentiles, profile summaries, quota rows,
and the open-loop generator's schedule (against an in-process aiohttp server)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from loadtests.bench import Result, parse_wrk, summarise_collapsed
from loadtests.bench import targets as bench_targets
from loadtests.loadgen import Record, Stream, open_loop, open_loop_in_processes, open_loop_lean
from loadtests.report import percentile, write_records
from loadtests.scenarios import _quota_row
from tests.rigs.raw_http import RawUpstream

WRK_OUTPUT = """Running 1s test @ http://127.0.0.1:18999/nonexistent
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.33ms    1.57ms  10.23ms   86.83%
    Req/Sec     1.99k   413.95     2.52k    54.55%
  Latency Distribution
     50%  701.00us
     75%    1.12ms
     90%    3.60ms
     99%    7.74ms
  2176 requests in 1.10s, 1.08MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 2176
Requests/sec:   1978.34
Transfer/sec:      0.98MB
"""


def test_parse_wrk_reads_the_latency_distribution_not_the_thread_stats() -> None:
    rps, p50, p99, total, errors = parse_wrk(WRK_OUTPUT)
    assert rps == 1978.34
    assert p50 == pytest.approx(0.701)
    assert p99 == pytest.approx(7.74)
    assert total == 2176
    assert errors == 2176 + 3


def test_parse_wrk_rejects_output_without_figures() -> None:
    with pytest.raises(RuntimeError, match="unexpected wrk output"):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 50))


def test_summarise_collapsed_counts_self_and_inclusive_time(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "main (/work/main/sidecar/cli/main.py:1);decide (/work/main/sidecar/pipeline/authorize.py:9) 3\n"
        "main (/work/main/sidecar/cli/main.py:1);write (/x/lib/python3.11/asyncio/t.py:5) 1\n"
    )
    text = summarise_collapsed(raw)
    assert "4 samples" in text
    assert "75.0%  decide (sidecar/pipeline/authorize.py)" in text
    assert "100.0%  main (sidecar/cli/main.py)" in text
    assert "25.0%  asyncio (event loop)" in text


def test_quota_row_reads_used_and_in_progress() -> None:
    body = {
        "tenant": "t",
        "quotas": [
            {"resource": "bays", "used": 1, "in_progress": 0},
            {"resource": "servers", "used": 20, "in_progress": 2},
        ],
    }
    assert _quota_row(body) == (20, 2)
    assert _quota_row({"quotas": []}) == (-1, -1)
    assert _quota_row("not json") == (-1, -1)


@pytest.mark.parametrize("run", [open_loop, open_loop_lean], ids=["aiohttp", "lean"])
async def test_open_loop_sends_exactly_rate_times_duration(
    tmp_path: Path, run: Callable[[list[Stream]], Awaitable[list[Record]]]
) -> None:
    """Both generators: exactly rate x duration requests per stream, each answer's
    status, Retry-After and Status reason recorded."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers["X-Stream"])
        if request.headers["X-Stream"] == "b":
            return web.json_response(
                {"reason": "TooManyRequests"}, status=429, headers={"Retry-After": "1"}
            )
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}/"
    try:
        records = await run(
            [
                Stream("a", 40, lambda _i: ("GET", url, {"X-Stream": "a"}, None), duration=0.5),
                Stream(
                    "b",
                    20,
                    lambda _i: ("GET", url, {"X-Stream": "b"}, None),
                    start=0.25,
                    duration=0.5,
                ),
            ]
        )
    finally:
        await runner.cleanup()
    a = [r for r in records if r.stream == "a"]
    b = [r for r in records if r.stream == "b"]
    assert len(a) == 20
    assert len(b) == 10
    assert seen.count("a") == 20
    assert seen.count("b") == 10
    assert all(r.status == 200 and r.reason == "" for r in a)
    assert all(
        r.status == 429 and r.retry_after == "1" and r.reason == "TooManyRequests" for r in b
    )
    assert min(r.t for r in b) >= 0.25
    write_records(tmp_path / "r.csv", records)
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert lines[0].startswith("t,stream,phase,status,reason")
    assert len(lines) == 31


def test_open_loop_in_processes_runs_each_group_on_one_schedule() -> None:
    with contextlib.ExitStack() as stack:
        raw = RawUpstream().start()
        stack.callback(raw.stop)
        url = raw.url + "/"
        records = open_loop_in_processes(
            [
                [Stream("a", 40, lambda _i: ("GET", url, {}, None), duration=0.5)],
                # A lean group (a flood's client) on the same schedule.
                [
                    Stream(
                        "b",
                        20,
                        lambda _i: ("GET", url, {}, None),
                        start=0.25,
                        duration=0.5,
                        lean=True,
                    )
                ],
            ],
            lead=0.2,
        )
    a = [r for r in records if r.stream == "a"]
    b = [r for r in records if r.stream == "b"]
    assert (len(a), len(b)) == (20, 10)
    assert {r.status for r in records} == {200}
    # One schedule: b's first request is sent about 0.25 s after a's, from another process.
    assert 0.15 < min(r.t for r in b) - min(r.t for r in a) < 0.5
    assert [r.t for r in records] == sorted(r.t for r in records)


def _result(config: str, workload: str, rps: float, p50: float = 1.0, rnd: int = 0) -> Result:
    return Result(config, workload, rps, p50, 2 * p50, 100, 0, "wrk", 100.0, rnd)


def _bench_results(
    c_ratio: float, d_ratio: float, added_ms: float, rounds: int = 1
) -> list[Result]:
    out: list[Result] = []
    for rnd in range(rounds):
        out += [
            _result("b passthrough", "get", 1000, rnd=rnd),
            _result("c sidecar w1", "get", 1000 * c_ratio, rnd=rnd),
            _result("b passthrough", "create", 500, rnd=rnd),
            _result("d sidecar w1", "create", 500 * d_ratio, rnd=rnd),
            _result("a direct", "get-c1", 200, p50=0.2, rnd=rnd),
            _result("b passthrough", "get-c1", 100, p50=0.4, rnd=rnd),
            _result("c sidecar w1", "get-c1", 100, p50=0.2 + added_ms, rnd=rnd),
        ]
    return out


def test_bench_targets_met_and_missed() -> None:
    met = {t.name: t.met for t in bench_targets(_bench_results(0.95, 0.6, 0.25), {}, [1])}
    assert all(met.values()), met
    missed = {t.name: t.met for t in bench_targets(_bench_results(0.94, 0.59, 0.26), {}, [1])}
    assert missed == {
        "cached reads >= 0.95 of the pass-through, 1 worker(s)": False,
        "creates with quota >= 0.6 of the pass-through's, 1 worker(s)": False,
        "p50 added unloaded over a direct call <= 0.25 ms": False,
        "no errors from the sidecar under load": True,
    }


def test_bench_targets_take_the_median_of_the_rounds() -> None:
    results = _bench_results(0.5, 0.6, 0.1, rounds=1)
    results += [replace(r, round=r.round + 1) for r in _bench_results(0.9, 0.6, 0.1, rounds=2)]
    ratio = next(t for t in bench_targets(results, {}, [1]) if t.name.startswith("cached"))
    assert (ratio.measured, ratio.met) == ("0.90 (aim 1.0: not met)", False)
    results = _bench_results(0.5, 0.6, 0.1, rounds=1)
    results += [replace(r, round=r.round + 1) for r in _bench_results(1.01, 0.6, 0.1, rounds=2)]
    ratio = next(t for t in bench_targets(results, {}, [1]) if t.name.startswith("cached"))
    assert (ratio.measured, ratio.met) == ("1.01 (aim 1.0: met)", True)


def test_bench_targets_read_the_policy_figures() -> None:
    policy = {
        "decisions": [
            {"size": "10k", "load_s": 9.0, "hit_p99": 1.0, "miss_p99": 1.0},
            {"size": "100k", "load_s": 6.4, "hit_p99": 5.0, "miss_p99": 300.0},
        ],
        "reload": [{"lines": 100001, "during_max_ms": 4.0, "after_max_ms": 12.5}],
    }
    met = {t.name: t.met for t in bench_targets([], policy, [])}
    assert met == {
        "no errors from the sidecar under load": True,
        "policy load + compile of 100k lines <= 6 s": False,
        "decision p99 on a cache hit <= 20 us": True,
        "decision p99 on a miss <= 250 us": False,
        "a reload of 100,001 lines pauses the loop <= 10 ms": False,
    }


def test_a_verdict_judges_the_figure_as_printed() -> None:
    from loadtests.report import meets

    assert meets(2.0, "<=", 2.0, ".2f")
    assert meets(2.004, "<=", 2, ".2f")  # printed 2.00: "2.00 (target <= 2)" passes
    assert not meets(2.006, "<=", 2, ".2f")  # printed 2.01
    assert meets(64.04, "<=", 64.0, ".1f")
    assert not meets(64.06, "<=", 64.0, ".1f")
    assert meets(0.846, ">=", 0.85, ".2f")  # printed 0.85
    assert not meets(0.844, ">=", 0.85, ".2f")
    assert not meets(math.nan, "<=", 2, ".2f")
    with pytest.raises(ValueError, match="unknown comparison"):
        meets(1.0, "<", 2, ".2f")

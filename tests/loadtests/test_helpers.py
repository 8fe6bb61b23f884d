"""The load-test helpers: wrk output parsing, percentiles, profile summaries, quota rows,
and the open-loop generator's schedule (against an in-process aiohttp server)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from aiohttp import web

from loadtests.bench import parse_wrk, summarise_collapsed
from loadtests.loadgen import Stream, open_loop
from loadtests.report import percentile, write_records
from loadtests.scenarios import _quota_row

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
        "main (/work/main/sidecar/cli.py:1);decide (/work/main/sidecar/authorize.py:9) 3\n"
        "main (/work/main/sidecar/cli.py:1);write (/x/lib/python3.11/asyncio/t.py:5) 1\n"
    )
    text = summarise_collapsed(raw)
    assert "4 samples" in text
    assert "75.0%  decide (sidecar/authorize.py)" in text
    assert "100.0%  main (sidecar/cli.py)" in text
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


async def test_open_loop_sends_exactly_rate_times_duration(tmp_path: Path) -> None:
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
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/"
    try:
        records = await open_loop(
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

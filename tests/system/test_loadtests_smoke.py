"""Smoke test of loadtests/: each scenario and the benchmark, a few seconds at tiny load.

Checks that each command starts what it needs, finishes, writes its CSV, summary
and charts, and stops everything it started (no process left, every port free).
The figures themselves are not asserted: DESIGN §11 targets are measured by the
scripts, never by tests.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rigs.paths import ROOT
from tests.rigs.redis_topologies import RedisClusterRig

_missing = [m for m in ("locust", "matplotlib") if importlib.util.find_spec(m) is None]
if _missing:
    if os.environ.get("CI") == "true":
        raise RuntimeError(
            f"the load extra is not installed ({', '.join(_missing)}); install '.[dev,load]'"
        )
    pytest.skip(f"needs the load extra: {', '.join(_missing)}", allow_module_level=True)

SCENARIOS = {
    "limits": ["limits.csv", "limits-requests.csv", "limits-rates.png", "limits-latency.png"],
    "noisy-neighbour": [
        "noisy-neighbour.csv",
        "noisy-neighbour-rates.png",
        "noisy-neighbour-latency.png",
    ],
    "quota-race": ["quota-race.csv", "quota-race.png"],
    "mix": ["mix_stats.csv", "mix-requests.png"],
    "big-lists": ["big-lists.csv", "big-lists-requests.csv", "big-lists-latency.png"],
    "reconcile-flood": [
        "reconcile-flood.csv",
        "reconcile-flood-requests.csv",
        "reconcile-flood-latency.png",
    ],
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    # A zombie is not running anything; it only waits to be reaped.
    return not (stat.exists() and ") Z " in stat.read_text())


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def _assert_all_stopped(out: Path) -> None:
    started = []
    for listing in out.glob("work-*/processes.json"):
        started += json.loads(listing.read_text())
    assert started, "the run recorded no process it started"
    for entry in started:
        assert not _alive(entry["pid"]), f"{entry['name']} (pid {entry['pid']}) still running"
        assert _port_free(entry["port"]), f"port {entry['port']} of {entry['name']} still open"
    assert _processes_mentioning(str(out)) == []


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The command to its end; past `timeout` it gets SIGTERM (as `timeout` and CI
    send), so it stops what it started, and the test fails with its output."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{args} took over {timeout} s (stopped with SIGTERM):\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _completed(done: subprocess.CompletedProcess[str]) -> None:
    """The run completed; its exit status is 1 exactly when a verdict says FAIL (the
    figures at this tiny load are not judged here, their agreement with the status is)."""
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert (done.returncode == 1) == ("FAIL" in done.stdout), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_runs_writes_results_and_stops_everything(
    scenario: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    done = _run(
        ["loadtests/run.py", scenario, "--seconds", "2", "--scale", "0.1", "--out", str(out)],
        timeout=60,
    )
    _completed(done)
    summary = out / f"{scenario}-summary.txt"
    assert summary.read_text().startswith(f"scenario: {scenario}")
    assert f"scenario: {scenario}" in done.stdout
    for name in SCENARIOS[scenario]:
        path = out / name
        assert path.exists(), f"{name} missing"
        assert path.stat().st_size > 0, f"{name} missing"
    with open(out / SCENARIOS[scenario][0]) as fh:
        rows = list(csv.DictReader(fh))
    assert rows, "the CSV has no data rows"
    if scenario == "quota-race" and os.environ.get("CI") == "true":
        assert {r["backend"] for r in rows} == {"sqlite", "redis"}
    _assert_all_stopped(out)


@pytest.mark.slow
def test_bench_runs_writes_results_and_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run(
        [
            "loadtests/bench.py",
            "--seconds",
            "0.5",
            "--rounds",
            "1",
            "--workers",
            "1",
            "--concurrency",
            "4",
            "--generator",
            "aiohttp",
            "--no-policy-bench",
            "--out",
            str(out),
        ],
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out / "bench.csv") as fh:
        configs = {(r["config"], r["workload"]) for r in csv.DictReader(fh)}
    assert configs == {
        ("a direct", "get"),
        ("b passthrough", "get"),
        ("c sidecar w1", "get"),
        ("a direct", "create"),
        ("b passthrough", "create"),
        ("d sidecar w1", "create"),
        ("a direct", "get-c1"),
        ("b passthrough", "get-c1"),
        ("c sidecar w1", "get-c1"),
        ("e sidecar w1", "refused"),
    }
    summary = (out / "bench-summary.txt").read_text()
    assert "a refusal (429" in summary
    assert "cached reads >= 0.95 of the pass-through, 1 worker(s)" in summary
    assert "creates with quota >= 0.6 of the pass-through's, 1 worker(s)" in summary
    assert "p50 added unloaded over a direct call <= 0.25 ms" in summary
    assert (out / "bench-throughput.png").stat().st_size > 0
    _assert_all_stopped(out)


def test_run_rejects_an_unknown_scenario(tmp_path: Path) -> None:
    done = _run(["loadtests/run.py", "nope", "--out", str(tmp_path)], timeout=30)
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


@pytest.mark.slow
def test_quota_race_runs_on_a_redis_cluster(tmp_path: Path, redis_cluster: RedisClusterRig) -> None:
    out = tmp_path / "out"
    done = _run(
        [
            "loadtests/run.py",
            "quota-race",
            "--ledger",
            redis_cluster.url,
            "--scale",
            "0.1",
            "--out",
            str(out),
        ],
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out / "quota-race.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["backend"], r["pass"]) for r in rows] == [("redis+cluster", "True")] * 2
    _assert_all_stopped(out)
    for node in redis_cluster.nodes:  # the run's ledger keys are gone from every master
        client = node.client()
        try:
            assert list(client.scan_iter(match="sidecar:quota:{race*")) == []
        finally:
            client.close()


def test_quota_race_refuses_a_malformed_ledger_url(tmp_path: Path) -> None:
    done = _run(
        [
            "loadtests/run.py",
            "quota-race",
            "--ledger",
            "redis+sentinel://:pw-x9@h:26379",
            "--out",
            str(tmp_path),
        ],
        timeout=30,
    )
    assert done.returncode == 2
    assert "--ledger" in done.stderr
    assert "SERVICE" in done.stderr
    assert "pw-x9" not in done.stderr + done.stdout


@pytest.mark.slow
def test_many_tenants_runs_writes_results_and_stops_everything(tmp_path: Path) -> None:
    """The many-tenants scenario at 3,000 tenants (its full run is 1,000,000)."""
    out = tmp_path / "out"
    done = _run(
        [
            *("loadtests/run.py", "many-tenants", "--tenants", "3000", "--seconds", "1"),
            *("--scale", "0.1", "--out", str(out)),
        ],
        timeout=90,
    )
    _completed(done)
    assert "scenario: many-tenants" in done.stdout
    with open(out / "many-tenants.csv") as fh:
        rows = {r["phase"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"1k", "fill", "after"}
    # 1,000 tenants, then the fill, then 100 new ones (100/s at --scale 0.1, for 1 s)
    assert int(rows["fill"]["flood_requests"]) == 3000 - 1000 - 100
    assert int(rows["1k"]["steady_ok"]) == int(rows["1k"]["steady_requests"]) > 0
    with open(out / "many-tenants-memory.csv") as fh:
        memory = list(csv.DictReader(fh))
    assert memory[-1]["tenants_seen"] == "3000"
    for name in ("many-tenants-latency.png", "many-tenants-memory.png"):
        assert (out / name).stat().st_size > 0
    _assert_all_stopped(out)

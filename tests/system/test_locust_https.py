"""The locust users (loadtests/locustfile.py) against an HTTPS sidecar: with
`LOADTEST_CA` naming the CA that signed the sidecar's certificate, every request gets
an answer from the sidecar; without it, none passes the TLS handshake (docs/performance.md
"mix"). Runs locust headless for a few seconds against the real sidecar and store (the
`cluster` fixture: HTTPS, a CA made for the test). Skipped without the `load` extra,
a failure under CI=true."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rigs import paths
from tests.rigs.cluster import NS, USERS, ClusterEnv

if importlib.util.find_spec("locust") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("locust is not installed (the `load` extra)")
    pytest.skip("locust is not installed (the `load` extra)", allow_module_level=True)

LOCUSTFILE = paths.ROOT / "loadtests" / "locustfile.py"


def run_locust(cluster: ClusterEnv, out: Path, ca: Path | None) -> tuple[int, list[dict[str, str]]]:
    """A short headless run as acme's alice in ns1: (requests, failure rows)."""
    out.mkdir()
    tenants = out / "tenants.json"
    token = USERS["alice"][0]
    tenants.write_text(json.dumps({"tenants": [{"name": "acme", "token": token, "namespace": NS}]}))
    env = {**os.environ, "LOADTEST_TENANTS": str(tenants), "LOADTEST_RATE": "20"}
    env.pop("LOADTEST_CA", None)
    env.pop("REQUESTS_CA_BUNDLE", None)
    if ca is not None:
        env["LOADTEST_CA"] = str(ca)
    # the behaviour under test: a timed load run, as the documented command makes one
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--users",
            "2",
            "--spawn-rate",
            "2",
            "--run-time",
            "3s",
            "-H",
            cluster.url,
            "--csv",
            str(out / "mix"),
            "--exit-code-on-error",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=out,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out / "mix_stats.csv") as fh:
        total = next(r for r in csv.DictReader(fh) if r["Name"] == "Aggregated")
    with open(out / "mix_failures.csv") as fh:
        failures = list(csv.DictReader(fh))
    return int(total["Request Count"]), failures


def test_locust_users_verify_the_sidecar_with_the_given_ca(
    cluster: ClusterEnv, tmp_path: Path
) -> None:
    requests, failures = run_locust(cluster, tmp_path / "with-ca", cluster.ca_file)
    assert requests > 0
    assert not [f for f in failures if "SSL" in f["Error"]], failures
    # Only the API's own answers fail: reads of servers the user has not made yet.
    assert {f["Name"] for f in failures} <= {"acme get server"}, failures


def test_without_the_ca_nothing_passes_the_handshake(cluster: ClusterEnv, tmp_path: Path) -> None:
    requests, failures = run_locust(cluster, tmp_path / "without-ca", None)
    assert requests > 0
    assert sum(int(f["Occurrences"]) for f in failures) == requests, failures
    assert all("CERTIFICATE_VERIFY_FAILED" in f["Error"] for f in failures), failures

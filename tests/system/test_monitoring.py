"""deploy/monitoring (issue 29 item 8): every metric the Grafana dashboard and the alert
rules use is exported by a real sidecar (HTTPS, its `metricsListen`) after some traffic:
reads, creates, a quota refusal, 429s, an open watch; the new gauges say what they
should (open watches per tenant up and back to 0, the certificate's notAfter, the
policy source and the ledger up); the rules parse and their unit tests pass with
promtool, and every alert has its runbook entry.

promtool comes from Debian's `prometheus` package, which .ci/run installs when it is
missing and apt is usable as root. Where it cannot be installed the rules are checked
here without it (YAML shape, balanced brackets, exported metric names). Under CI=true a
missing promtool where .ci/run could have installed it is a failure, never a silent
pass."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from sidecar.cli.launch import free_port
from tests.rigs import paths, processes
from tests.rigs.cluster import USERS, ClusterEnv, start_cluster, stop_cluster
from tests.rigs.waiting import eventually, eventually_sync

MONITORING = paths.ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yaml"
RULE_TESTS = MONITORING / "alerts-test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
RUNBOOK = paths.ROOT / "docs" / "runbook.md"
METRIC = re.compile(r"\b((?:sidecar|process|python)_[a-z0-9_]+)\b")

# beta: a tight rate limit and one configmap, so its traffic shows 429s and a refusal.
EXTRA_POLICY = """\
kind: RateLimit
metadata: {name: beta-tight}
spec: {tenant: beta, rate: 1, burst: 4, maxInFlight: 8}
---
kind: TenantResourceQuota
metadata: {name: beta, tenant: beta}
spec: {hard: {configmaps: 1}}
"""


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    return exprs


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _used_metrics() -> set[str]:
    used: set[str] = set()
    for expr in _dashboard_exprs() + [r["expr"] for r in _rules()]:
        used |= set(METRIC.findall(expr))
    return used


@dataclass
class Monitored:
    env: ClusterEnv
    metrics_url: str


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    tmp = tmp_path_factory.mktemp("monitoring")
    policies = tmp / "policies"
    shutil.copytree(paths.SHIPPED_POLICIES, policies, ignore=shutil.ignore_patterns("tests"))
    (policies / "99-monitoring-test.yaml").write_text(EXTRA_POLICY)
    port = free_port()
    env = start_cluster(
        tmp,
        policies=policies,
        extra={"metricsListen": f"127.0.0.1:{port}", "quota": {"gaugeIntervalSeconds": 0.5}},
    )
    yield Monitored(env, f"http://127.0.0.1:{port}/metrics")
    stop_cluster(env)


async def _scrape(http: aiohttp.ClientSession, url: str) -> dict[str, list[Any]]:
    async with http.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _value(samples: dict[str, list[Any]], name: str, **labels: str) -> float | None:
    for sample in samples.get(name, []):
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    return None


async def test_every_metric_the_dashboard_and_the_rules_use_is_exported(
    monitored: Monitored,
) -> None:
    cluster, url = monitored.env, monitored.metrics_url

    def auth(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {USERS[user][0]}"}

    cms = cluster.url + "/api/v1/namespaces/ns1/configmaps"
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=cluster.trust),
        timeout=aiohttp.ClientTimeout(total=30),
    ) as http:
        for name in ("web", "db"):
            async with http.post(
                cms, json={"metadata": {"name": name}}, headers=auth("alice")
            ) as r:
                assert r.status == 201, await r.text()
        async with http.get(cms, headers=auth("alice")) as r:
            assert r.status == 200
        codes = []
        for name in ("one", "two"):  # beta's quota is one configmap
            async with http.post(cms, json={"metadata": {"name": name}}, headers=auth("bob")) as r:
                codes.append(r.status)
        assert codes == [201, 403], codes
        for _ in range(10):  # past beta's burst
            async with http.get(cms, headers=auth("bob")) as r:
                codes.append(r.status)
        assert 429 in codes, codes

        watch = await http.get(cms + "?watch=1", headers=auth("alice"))
        try:
            assert watch.status == 200
            samples = await eventually(
                lambda: _when(
                    http, url, lambda s: _value(s, "sidecar_watches_open", tenant="acme")
                ),
                what="acme's open watch counted",
            )
            assert _value(samples, "sidecar_watches_open", tenant="acme") == 1
            samples = await eventually(
                lambda: _when(
                    http,
                    url,
                    lambda s: (
                        _value(s, "sidecar_quota_used", tenant="beta", resource="configmaps")
                        is not None
                        and _value(s, "sidecar_ledger_up") == 1
                    ),
                ),
                what="the quota gauges and the ledger check",
            )
            exported = set(samples)
            missing = sorted(_used_metrics() - exported)
            assert not missing, f"used by deploy/monitoring but not exported: {missing}"
        finally:
            watch.close()

        samples = await eventually(
            lambda: _when(
                http, url, lambda s: _value(s, "sidecar_watches_open", tenant="acme") == 0
            ),
            what="acme's watch gone from the gauge",
        )

    # The values say what they should.
    cert = x509.load_pem_x509_certificate((cluster.tmp / "tls.crt").read_bytes())
    expiry = _value(samples, "sidecar_tls_certificate_expiry_timestamp_seconds")
    assert expiry == cert.not_valid_after_utc.timestamp()
    assert _value(samples, "sidecar_tls_certificate_reload_ok") == 1
    assert _value(samples, "sidecar_policy_source_ok") == 1
    loaded = _value(samples, "sidecar_policy_loaded_timestamp_seconds")
    assert loaded is not None
    assert 0 < time.time() - loaded < 600
    assert (
        _value(samples, "sidecar_quota_refusals_total", tenant="beta", resource="configmaps") == 1
    )
    assert (_value(samples, "process_open_fds") or 0) > 0
    assert _value(samples, "sidecar_ready_check", check="ledger") == 1  # with nobody probing


async def _when(http: aiohttp.ClientSession, url: str, test: Any) -> dict[str, list[Any]] | None:
    samples = await _scrape(http, url)
    return samples if test(samples) else None


# -- the rules ------------------------------------------------------------------------


def _promtool() -> str | None:
    found = shutil.which("promtool")
    if found is None and os.environ.get("CI") == "true":
        installable = os.geteuid() == 0 and shutil.which("apt-get") is not None
        if installable:
            pytest.fail(
                "promtool is missing although apt is usable as root: .ci/run installs "
                "Debian's prometheus package for it"
            )
    return found


def test_the_rules_parse_and_their_unit_tests_pass() -> None:
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool is not installed (and cannot be here); see the next test")
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run(
            [promtool, *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout + done.stderr


def test_the_rules_without_promtool() -> None:
    """What holds whether or not promtool is here: each rule's shape, its expression's
    brackets, a runbook entry per alert, every alert named in the rule tests."""
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    assert {
        "SidecarLedgerDown",
        "SidecarPolicyReloadFailing",
        "SidecarCertificateExpiringSoon",
        "SidecarHigh5xxRatio",
        "SidecarTenantPinnedAtRateLimit",
        "SidecarTenantPinnedAtQuota",
    } <= set(names)
    anchors = {
        "docs/runbook.md#" + line[3:].strip().lower()
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("## ")
    }
    tested = RULE_TESTS.read_text()
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["annotations"]["runbook_url"] in anchors, rule["alert"]
        assert rule["annotations"]["summary"]
        _balanced(rule["expr"])
        assert METRIC.search(rule["expr"]), rule["alert"]
        assert f"alertname: {rule['alert']}" in tested, f"{rule['alert']} has no rule test"
    for expr in _dashboard_exprs():
        _balanced(expr)


def _balanced(expr: str) -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    quoted = False
    for ch in expr:
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            assert stack, expr
            assert stack.pop() == pairs[ch], expr
    assert not stack, expr
    assert not quoted, expr


def test_the_dashboard_is_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"]
    assert dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def _scrape_sync(url: str) -> dict[str, list[Any]]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def test_the_gauges_follow_a_ledger_outage_and_a_refused_policy(
    tmp_path: Path, procs: processes.Processes
) -> None:
    """What SidecarLedgerDown and SidecarPolicyReloadFailing watch: the ledger gauge goes
    to 0 while its Redis is away and back to 1 when it comes (nobody probing /readyz),
    the policy gauge to 0 while a broken change is refused and back to 1 when fixed; no
    TLS here, so no certificate series (the expiry alert cannot fire on a 0)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    store = procs.store()
    policies = tmp_path / "policies"
    policies.mkdir()
    good = "kind: QuotaDefaults\nmetadata: {name: defaults}\nspec: {hard: {servers: 3}}\n"
    (policies / "quotas.yaml").write_text(good)
    port = free_port()
    sidecar = procs.sidecar(
        {
            "upstream": store.url,
            "policies": str(policies),
            "ledger": f"redis://127.0.0.1:{port}/0",
            "quota": {"gaugeIntervalSeconds": 0.2, "redisPrefix": f"h29mon{port}:"},
            "reload": {"enabled": True, "pollSeconds": 0.2, "debounceSeconds": 0.05},
        },
        metrics=True,
    )
    url = f"http://127.0.0.1:{sidecar.extra['metrics_port']}/metrics"

    def gauge(name: str, want: float) -> bool:
        return _value(_scrape_sync(url), name) == want

    eventually_sync(lambda: gauge("sidecar_ledger_up", 0), what="ledger down: 0")
    samples = _scrape_sync(url)
    assert "sidecar_tls_certificate_expiry_timestamp_seconds" not in samples
    assert _value(samples, "sidecar_policy_source_ok") == 1
    redis_proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually_sync(lambda: gauge("sidecar_ledger_up", 1), within=20, what="ledger up: 1")
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
    (policies / "quotas.yaml").write_text("kind: QuotaDefaults\nspec: [broken\n")
    eventually_sync(lambda: gauge("sidecar_policy_source_ok", 0), what="policy refused: 0")
    (policies / "quotas.yaml").write_text(good.replace("3", "4"))
    eventually_sync(lambda: gauge("sidecar_policy_source_ok", 1), what="policy fixed: 1")


def test_with_workers_the_gauges_cover_every_worker_and_no_certificate_shows(
    tmp_path: Path, procs: processes.Processes
) -> None:
    """`--workers 2` (prometheus-client's multiprocess files): the ledger, policy and
    process series are there, and without TLS no certificate series shows (a 0 from a
    worker's empty file would read as an expired certificate)."""
    store = procs.store()
    sidecar = procs.sidecar(
        {
            "upstream": store.url,
            "policies": str(paths.SHIPPED_POLICIES),
            "workers": 2,
            "quota": {"gaugeIntervalSeconds": 0.2},
        },
        metrics=True,
    )
    url = f"http://127.0.0.1:{sidecar.extra['metrics_port']}/metrics"

    def ledger_checked() -> dict[str, list[Any]] | None:
        samples = _scrape_sync(url)
        return samples if _value(samples, "sidecar_ledger_up") == 1 else None

    samples = eventually_sync(ledger_checked, what="every worker's ledger check")
    assert _value(samples, "sidecar_policy_source_ok") == 1
    assert (_value(samples, "process_open_fds") or 0) > 0
    assert not [n for n in samples if n.startswith("sidecar_tls_")]

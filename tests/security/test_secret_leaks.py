"""Secrets in logs and answers (DESIGN §9): passwords in URLs (the global rate-limit
tier's Redis and the Redis ledger, each one server, a Redis Cluster or a Sentinel set;
the upstream) never appear in the process log, in `/readyz`, in `/metrics` or in any
error body, even while those services are down and every request logs or answers
about them. Real sidecar and backing store processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from tests.rigs import paths, processes, tenancy
from tests.rigs.waiting import eventually

PASSWORD = "s3cret"
SERVERS = "/apis/compute/v1/tenants/acme/namespaces/default/servers"


def closed_port() -> int:
    return processes.free_port()  # bound and released: nothing listens there


@pytest.mark.parametrize(
    "form", ["redis://H/0", "redis+cluster://H,H", "redis+sentinel://H,H/mymaster"]
)
async def test_redis_passwords_never_leak(tmp_path: Path, form: str) -> None:
    scheme, _, rest = form.partition("://")
    hosts = ",".join(f"127.0.0.1:{closed_port()}" for _ in rest.split("/")[0].split(","))
    redis = f"{scheme}://:{PASSWORD}@{hosts}/{rest.partition('/')[2]}".rstrip("/")
    async with tenancy.running(
        tmp_path,
        ledger=redis,
        rateLimit={"global": redis, "failOpenLogInterval": 0.01, "redisTimeout": 0.2},
    ) as env:
        port = int(env.url.rsplit(":", 1)[1])
        log_path = tmp_path / f"sidecar-{port}.log"
        bodies: list[str] = []
        status, body = await env.call(
            "admin", "POST", "/api/v1/tenants", {"metadata": {"name": "acme"}}
        )
        assert status == 201, body

        # Enough traffic to log the global tier's fail-open more than once.
        async def traffic_until_failing_open() -> bool:
            _status, body = await env.call("acme-admin", "GET", SERVERS)
            bodies.append(str(body))
            return "failing open" in harness_log(log_path)

        await eventually(traffic_until_failing_open, 10, what="the fail-open logged")
        # A quota-tracked create needs the ledger: refused, with a Status body.
        status, body = await env.call("acme-admin", "POST", SERVERS, {"metadata": {"name": "s1"}})
        assert status == 503, body
        assert body["kind"] == "Status", body
        bodies.append(str(body))
        for path in ("/quota/v1/tenants/acme", "/quota/v1/tenants"):
            status, body = await env.call("admin", "GET", path)
            assert status < 500 or body["kind"] == "Status", body
            bodies.append(str(body))
        async with env.http.get(env.url + "/readyz") as resp:
            readyz = await resp.text()
        async with env.http.get(
            env.url + "/metrics", headers={"Authorization": "Bearer admin"}
        ) as resp:
            metrics = await resp.text()

    for where, text in [
        ("log", harness_log(log_path)),
        ("readyz", readyz),
        ("metrics", metrics),
        *[("body", b) for b in bodies],
    ]:
        assert PASSWORD not in text, (where, text[-2000:])
    checks = json.loads(readyz)["checks"]
    assert checks["ledger"]["ok"] is False, readyz
    assert "failing open to the local tier" in checks["ratelimit"]["detail"], readyz


async def test_upstream_password_never_leaks(tmp_path: Path) -> None:
    proc = await asyncio.to_thread(
        processes.start_sidecar,
        tmp_path,
        {
            "upstream": f"http://ops:{PASSWORD}@127.0.0.1:{closed_port()}",
            "policies": str(paths.ROOT / "policies"),
            "identity": {"tokenFile": str(processes.write_tokens(tmp_path, tenancy.TOKENS))},
            "reload": {"enabled": False},
        },
    )
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(proc.url + "/readyz") as resp:
                readyz = await resp.text()
            async with http.get(
                proc.url + "/api/v1/namespaces/default/configmaps",
                headers={"Authorization": "Bearer acme-admin"},
            ) as resp:
                body = await resp.text()
    finally:
        proc.stop()
    for where, text in [("log", proc.log()), ("readyz", readyz), ("body", body)]:
        assert PASSWORD not in text, (where, text[-2000:])


def harness_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""

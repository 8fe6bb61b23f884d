"""`/metrics` names every tenant with its activity and quota, so it is not public
(DESIGN §9): on the main listener it is authorized like any non-resource URL
(`nonResourceURLs: ["/metrics"]`, verb `get`), through identity, rate limit and the
policy decision; `metricsListen` serves it without credentials on its own address.
Real sidecar and backing store processes with the shipped policies."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
from yarl import URL

from tests.rigs import processes, tenancy
from tests.rigs.tenancy import SHIPPED_POLICIES, TOKENS

# The shipped `monitoring` ClusterRoleBinding binds group `system:monitoring`.
PROMETHEUS = {
    "token": "prom",
    "user": "prometheus",
    "tenant": "system",
    "groups": ["system:monitoring"],
}


def policies_with_monitoring(tmp: Path) -> Path:
    """A copy of the shipped policies (which bind `monitoring` to `system:monitoring`)."""
    target = tmp / "policies"
    shutil.copytree(SHIPPED_POLICIES, target)
    return target


async def get(
    http: aiohttp.ClientSession, url: str, token: str | None = None, method: str = "GET"
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.request(method, URL(url, encoded=True), headers=headers) as resp:
        return resp.status, await resp.text()


async def test_metrics_on_the_main_listener_are_authorized(tmp_path: Path) -> None:
    tokens = processes.write_tokens(tmp_path, [*TOKENS, PROMETHEUS], name="all-tokens.yaml")
    async with tenancy.running(
        tmp_path, policies_with_monitoring(tmp_path), identity={"tokenFile": str(tokens)}
    ) as env:
        # Activity of two tenants, so there is something to leak.
        for token in ("acme-admin", "beta-admin"):
            await env.call(token, "GET", "/api/v1/namespaces/default/configmaps")

        status, body = await get(env.http, env.url + "/metrics")
        assert status == 401, body
        assert '"kind": "Status"' in body or '"kind":"Status"' in body
        assert "sidecar_requests_total" not in body

        # A tenant user, whatever its role in its tenant, is refused, under every spelling.
        for token in ("acme-admin", "beta-user", "acme-dev"):
            for path in ("/metrics", "/metrics?name[]=x", "/metrics/", "/%6detrics", "/metrics%3F"):
                status, body = await get(env.http, env.url + path, token)
                assert 400 <= status < 500, (token, path, status)
                assert "sidecar_requests_total" not in body, (token, path)
                assert "beta" not in body or token == "beta-user", (token, path, body)
            status, _ = await get(env.http, env.url + "/metrics", token)
            assert status == 403, token

        # The platform's operators: cluster-admin, and the shipped `monitoring` role.
        for token in ("admin", "prom"):
            status, body = await get(env.http, env.url + "/metrics", token)
            assert status == 200, (token, body)
            assert 'tenant="acme"' in body
            assert 'tenant="beta"' in body
            assert "sidecar_requests_total" in body
        # `monitoring` grants /metrics and nothing else.
        status, _ = await get(env.http, env.url + "/api/v1/tenants", "prom")
        assert status in (403, 404)

        # Any other method is refused by the sidecar; /metrics is never forwarded.
        status, body = await get(env.http, env.url + "/metrics", "admin", method="POST")
        assert status == 405
        assert '"Status"' in body
        assert env.upstream_saw("/metrics") == []


async def test_metrics_requests_pass_the_rate_limiter(tmp_path: Path) -> None:
    """An anonymous client polling /metrics is rate-limited like any other caller."""
    async with tenancy.running(tmp_path, rateLimit={"anonymous": {"rate": 1, "burst": 3}}) as env:
        statuses = [(await get(env.http, env.url + "/metrics"))[0] for _ in range(10)]
        assert set(statuses) <= {401, 429}
        assert 429 in statuses


async def test_metrics_listen_serves_a_scraper_without_credentials(tmp_path: Path) -> None:
    async with tenancy.running(tmp_path, metrics=True) as env:
        await env.call("acme-admin", "GET", "/api/v1/namespaces/default/configmaps")
        scrape = f"http://127.0.0.1:{env.sidecar.extra['metrics_port']}"
        status, body = await get(env.http, scrape + "/metrics")
        assert status == 200, body
        assert 'tenant="acme"' in body
        # Only /metrics on that address; anything else is a Status 404.
        status, body = await get(env.http, scrape + "/api/v1/tenants")
        assert status == 404
        assert '"Status"' in body
        # The main listener still refuses anonymous and tenant callers.
        status, body = await get(env.http, env.url + "/metrics")
        assert status == 401
        assert "sidecar_requests_total" not in body
        status, _ = await get(env.http, env.url + "/metrics", "acme-admin")
        assert status == 403
        assert env.upstream_saw("/metrics") == []


async def test_dry_run_never_opens_metrics(tmp_path: Path) -> None:
    """Dry-run forwards what it would deny; /metrics is never forwarded, and never
    answered to a caller the policy does not grant it."""
    async with tenancy.running(tmp_path, mode="dry-run") as env:
        status, body = await get(env.http, env.url + "/metrics", "acme-admin")
        assert status == 403
        assert "sidecar_requests_total" not in body
        status, body = await get(env.http, env.url + "/metrics", "admin")
        assert status == 200
        assert "sidecar_requests_total" in body
        assert env.upstream_saw("/metrics") == []

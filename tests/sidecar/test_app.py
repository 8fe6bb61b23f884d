"""The wiring of `sidecar/app.py`, in process: the routes, the readiness checks it
registers, and what each route's chain does before its terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from sidecar.app import READINESS_KEY, build_app
from sidecar.config.settings import load_config
from tests.rigs import paths, processes

ROOT = paths.ROOT


def make_config(tmp_path: Path) -> Any:
    tokens = processes.write_tokens(
        tmp_path,
        [{"token": "t-alice", "user": "alice", "tenant": "acme", "groups": ["tenant-admins"]}],
    )
    raw = {
        # Nothing listens there: the sidecar must answer everything below itself.
        "upstream": f"http://127.0.0.1:{processes.free_port()}",
        "policies": str(ROOT / "policies"),
        "identity": {"tokenFile": str(tokens)},
        "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
        "audit": {"path": str(tmp_path / "audit.log")},
        "reload": {"enabled": False},
    }
    return load_config(processes.write_config(tmp_path, raw), env={})


@pytest.fixture
async def client(tmp_path: Path, aiohttp_client: Any) -> TestClient[web.Request, web.Application]:
    result: TestClient[web.Request, web.Application] = await aiohttp_client(
        build_app(make_config(tmp_path))
    )
    return result


async def test_readiness_checks_are_the_registered_ones(
    client: TestClient[web.Request, web.Application],
) -> None:
    response = await client.get("/readyz")
    body = await response.json()
    assert set(body["checks"]) == {
        "policy",
        "upstream",
        "apiPolicy",
        "ledger",
        "ratelimit",
        "audit",
        "credentials",
    }
    assert {n for n, c in body["checks"].items() if c["required"]} == {
        "policy",
        "upstream",
        "apiPolicy",
    }
    # The upstream is down: a required check fails, so the sidecar cannot serve.
    assert response.status == 503
    # The policy objects stored through the API cannot be loaded from it either.
    assert sorted(body["degraded"]) == ["apiPolicy", "upstream"]
    names = [c.name for c in client.app[READINESS_KEY].checks]
    assert names == [
        "policy",
        "upstream",
        "apiPolicy",
        "ledger",
        "ratelimit",
        "audit",
        "credentials",
    ]


async def test_a_check_registered_twice_is_refused(
    client: TestClient[web.Request, web.Application],
) -> None:
    readiness = client.app[READINESS_KEY]

    async def probe() -> tuple[bool, str]:
        return True, "ok"

    with pytest.raises(ValueError, match="twice"):
        readiness.add("ledger", probe)


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_probes_answer_get_only_with_a_status_body(
    client: TestClient[web.Request, web.Application], path: str
) -> None:
    response = await client.post(path, data=b"x")
    assert response.status == 405
    assert response.headers["Allow"] == "GET, HEAD"
    assert (await response.json())["kind"] == "Status"


@pytest.mark.parametrize(
    "path", ["/metrics", "/quota/v1", "/quota/v1/defaults", "/api/v1/namespaces/dev/pods"]
)
async def test_every_other_route_starts_with_authentication(
    client: TestClient[web.Request, web.Application], path: str
) -> None:
    response = await client.get(path)
    assert response.status == 401
    body = await response.json()
    assert body["kind"] == "Status"
    assert body["code"] == 401
    assert response.headers["X-Request-Id"]


async def test_metrics_route_is_authorized_and_never_forwarded(
    client: TestClient[web.Request, web.Application],
) -> None:
    # A tenant admin has no grant of nonResourceURLs [/metrics]: 403, never forwarded.
    response = await client.get("/metrics", headers={"Authorization": "Bearer t-alice"})
    assert response.status == 403
    assert (await response.json())["kind"] == "Status"


async def test_quota_route_is_answered_by_the_sidecar(
    client: TestClient[web.Request, web.Application],
) -> None:
    response = await client.get("/quota/v1/defaults", headers={"Authorization": "Bearer t-alice"})
    assert response.status == 200
    assert "servers" in (await response.json())["hard"]


async def test_forwarded_route_reaches_the_proxy(
    client: TestClient[web.Request, web.Application],
) -> None:
    # The upstream is down: the proxy (the catch-all's terminal) answers 502.
    response = await client.get(
        "/api/v1/namespaces/default/configmaps", headers={"Authorization": "Bearer t-alice"}
    )
    assert response.status == 502
    assert (await response.json())["kind"] == "Status"

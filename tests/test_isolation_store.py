"""Isolation and identity against the real backing store (a process): a concealed
tenant answers byte for byte what a tenant that does not exist answers, and short
paths land in the caller's own tenant whatever X-Remote-* headers the client sends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests import harness
from tests.test_identity_support import running_sidecar
from tests.test_isolation import TOKEN_OF, sidecar_config


@pytest.fixture
def backing(tmp_path: Path) -> Iterator[harness.Proc]:
    proc = harness.start_store(tmp_path)
    yield proc
    proc.stop()


class Client:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def __call__(
        self, who: str, method: str, path: str, body: Any = None, **headers: str
    ) -> tuple[int, bytes]:
        h = {"Authorization": f"Bearer {TOKEN_OF[who]}", **headers}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        async with self.http.request(method, self.url + path, data=data, headers=h) as resp:
            return resp.status, await resp.read()


@pytest.fixture
async def client(tmp_path: Path, backing: harness.Proc) -> AsyncIterator[Client]:
    async with running_sidecar(tmp_path, backing.url, sidecar_config(tmp_path)) as url:
        async with aiohttp.ClientSession() as http:
            call = Client(http, url)
            for tenant in ("acme", "beta"):
                status, body = await call(
                    "system", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
                )
                assert status == 201, body
            yield call


async def test_concealed_tenant_is_byte_for_byte_a_missing_tenant(client: Client) -> None:
    pairs = [
        ("/api/v1/tenants/beta", "/api/v1/tenants/nosuch"),
        (
            "/api/v1/tenants/beta/namespaces/default/configmaps",
            "/api/v1/tenants/nosuch/namespaces/default/configmaps",
        ),
        ("/api/v1/tenants/beta/namespaces", "/api/v1/tenants/nosuch/namespaces"),
    ]
    for hidden, missing in pairs:
        status_hidden, body_hidden = await client("acme", "GET", hidden)
        # The operator may look anywhere, so this answer comes from the store itself.
        status_missing, body_missing = await client("system", "GET", missing)
        assert status_hidden == status_missing == 404
        assert body_hidden == body_missing.replace(b"nosuch", b"beta")
        # And beta really exists: its own user can read it.
        status, _ = await client("beta", "GET", "/api/v1/tenants/beta/namespaces")
        assert status == 200


async def test_short_path_lands_in_callers_tenant_despite_spoofing(client: Client) -> None:
    spoof = {"X-Remote-Tenant": "beta", "X-Remote-User": "root"}
    status, body = await client(
        "acme",
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "cm1"}},
        **spoof,
    )
    assert status == 201, body
    created = json.loads(body)
    assert created["metadata"]["tenant"] == "acme"
    status, _ = await client(
        "system", "GET", "/api/v1/tenants/acme/namespaces/default/configmaps/cm1"
    )
    assert status == 200
    status, _ = await client(
        "system", "GET", "/api/v1/tenants/beta/namespaces/default/configmaps/cm1"
    )
    assert status == 404
    # beta's user, by short path, sees its own tenant's (empty) namespace only.
    status, body = await client("beta", "GET", "/api/v1/namespaces/default/configmaps")
    assert status == 200 and json.loads(body)["items"] == []
    # acme's user cannot list across tenants nor delete beta's tenant.
    status, _ = await client("acme", "GET", "/api/v1/configmaps")
    assert status == 404
    status, _ = await client("acme", "DELETE", "/api/v1/tenants/beta")
    assert status == 404
    status, _ = await client("beta", "GET", "/api/v1/tenants/beta/namespaces/default")
    assert status == 200

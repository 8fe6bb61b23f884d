"""Kubernetes protobuf bodies through the real sidecar and the real store (DESIGN §10).

The bodies are the ones kubectl 1.32 sends (tests/fixtures/protobuf/, recorded by
tests/test_kube_protobuf.py). A body the sidecar reads becomes JSON before any stage
sees it, and the store (which reads JSON only) stores exactly that object and the quota
charges it; every refused body — another kind, a kind sent to another resource, garbage,
a truncated body, CBOR — gets a Status and leaves nothing stored and nothing charged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.kube_protobuf import MEDIA_TYPE
from tests import harness
from tests.test_kube_protobuf import envelope, ld, pod_body

FIXTURES = Path(__file__).parent / "fixtures" / "protobuf"

POLICY = """
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
- {nonResourceURLs: ["*"], verbs: ["*"]}
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: admin}]
---
kind: TenantRoleBinding
metadata: {name: acme-admins, tenant: acme}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: alice}]
---
kind: TenantRoleBinding
metadata: {name: beta-admins, tenant: beta}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: bob}]
---
kind: QuotaDefaults
metadata: {name: defaults}
spec: {hard: {configmaps: LIMIT, servers: LIMIT, requests.cpu: "1"}}
"""
TOKENS = [
    {"token": "admin-token", "user": "admin", "tenant": "system", "groups": []},
    {"token": "alice-token", "user": "alice", "tenant": "acme", "groups": []},
    {"token": "bob-token", "user": "bob", "tenant": "beta", "groups": []},
]
ADMIN, ALICE, BOB = "admin-token", "alice-token", "bob-token"
CONFIGMAPS = "/api/v1/namespaces/ns1/configmaps"


@dataclass
class Env:
    """The real store and the real sidecar in front of it, tenants acme and beta with a
    namespace ns1 each, and a quota of `limit` configmaps and servers per tenant."""

    url: str
    store: harness.Proc
    http: aiohttp.ClientSession
    sidecar: harness.Proc

    @property
    def store_url(self) -> str:
        return self.store.url

    def stop_store(self) -> None:
        self.store.stop()

    async def call(
        self,
        token: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {token}", **(headers or {})}
        data: bytes | None = None
        if isinstance(body, bytes):
            data = body
        elif body is not None:
            data = json.dumps(body).encode()
            content_type = content_type or "application/json"
        if content_type:
            sent["Content-Type"] = content_type
        async with self.http.request(method, self.url + path, data=data, headers=sent) as resp:
            raw = await resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw

    async def used(self, tenant: str, resource: str) -> tuple[str, str]:
        """(used, in_progress) of one resource in a tenant, from the quota API."""
        status, body = await self.call(ADMIN, "GET", f"/quota/v1/tenants/{tenant}/usage")
        assert status == 200, body
        row = body["usage"].get(resource, {"used": 0, "in_progress": 0})
        return str(row["used"]), str(row["in_progress"])

    async def stored(self, tenant: str, path: str) -> list[str]:
        """Names the store holds (asked directly, as a system caller, by tenant path)."""
        headers = {"X-Remote-User": "test", "X-Remote-Tenant": "system"}
        url = f"{self.store_url}/api/v1/tenants/{tenant}/{path}"
        async with self.http.get(url, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return [item["metadata"]["name"] for item in (await resp.json())["items"]]


def write_policies(tmp: Path, limit: int) -> Path:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(POLICY.replace("LIMIT", str(limit)))
    return policies


def sidecar_config(tmp: Path, upstream: str, limit: int, **extra: Any) -> dict[str, Any]:
    tokens = harness.write_tokens(tmp, TOKENS)
    config: dict[str, Any] = {
        "upstream": upstream,
        "policies": str(write_policies(tmp, limit)),
        "identity": {"tokenFile": str(tokens)},
        "reload": {"enabled": False},
    }
    config.update(extra)
    return config


async def seed(env: Env) -> None:
    for tenant in ("acme", "beta"):
        status, body = await env.call(
            ADMIN, "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
        )
        assert status == 201, body
        status, body = await env.call(
            ADMIN, "POST", f"/api/v1/tenants/{tenant}/namespaces", {"metadata": {"name": "ns1"}}
        )
        assert status == 201, body


@asynccontextmanager
async def running_env(
    tmp: Path, limit: int, env: dict[str, str] | None = None, **extra: Any
) -> AsyncIterator[Env]:
    """`extra`: more sidecar config keys; `env`: the sidecar's environment additions."""
    store = harness.start_store(tmp)
    sidecar = harness.start_sidecar(tmp, sidecar_config(tmp, store.url, limit, **extra), env=env)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            env = Env(sidecar.url, store, http, sidecar)
            await seed(env)
            yield env
    finally:
        sidecar.stop()
        store.stop()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with running_env(tmp_path, limit=5) as e:
        yield e


def fixture(name: str) -> bytes:
    return (FIXTURES / f"{name}.pb").read_bytes()


# -- bodies the sidecar reads -------------------------------------------------------------


async def test_kubectl_configmap_is_stored_as_json_and_charged(env: Env) -> None:
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, fixture("configmap"), MEDIA_TYPE)
    assert status == 201, body
    assert body["metadata"]["name"] == "cm1"
    status, obj = await env.call(ALICE, "GET", f"{CONFIGMAPS}/cm1")
    assert status == 200, obj
    assert obj["data"] == {"a": "b"}
    assert "bin" in obj["binaryData"]
    assert obj["metadata"]["tenant"] == "acme"
    assert await env.used("acme", "configmaps") == ("1", "0")


@pytest.mark.parametrize(
    ("name", "collection", "resource"),
    [
        ("secret", "/api/v1/namespaces/ns1/secrets", "secrets"),
        ("serviceaccount", "/api/v1/namespaces/ns1/serviceaccounts", "serviceaccounts"),
    ],
)
async def test_kubectl_typed_creates_are_stored(
    env: Env, name: str, collection: str, resource: str
) -> None:
    status, body = await env.call(ALICE, "POST", collection, fixture(name), MEDIA_TYPE)
    assert status == 201, body
    assert await env.stored("acme", f"namespaces/ns1/{resource}") == [body["metadata"]["name"]]
    assert await env.used("acme", resource) == ("1", "0")


async def test_transcoded_create_is_still_isolated(env: Env) -> None:
    """Another tenant's tenant path stays concealed, body or not: nothing stored there."""
    status, body = await env.call(
        BOB,
        "POST",
        "/api/v1/tenants/acme/namespaces/ns1/configmaps",
        fixture("configmap"),
        MEDIA_TYPE,
    )
    assert status == 404, body
    assert body["kind"] == "Status"
    assert await env.stored("acme", "namespaces/ns1/configmaps") == []


async def test_transcoded_create_still_meets_the_quota(tmp_path: Path) -> None:
    async with running_env(tmp_path, limit=0) as env:
        status, body = await env.call(ALICE, "POST", CONFIGMAPS, fixture("configmap"), MEDIA_TYPE)
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded"
        assert await env.stored("acme", "namespaces/ns1/configmaps") == []
        assert await env.used("acme", "configmaps") == ("0", "0")


# -- refused bodies: a Status, nothing stored, nothing charged ----------------------------

MAGIC_ONLY = b"k8s\x00"


@pytest.mark.parametrize(
    ("path", "body", "content_type", "code", "says"),
    [
        ("/api/v1/namespaces/ns1/pods", pod_body(), MEDIA_TYPE, 415, "Pod"),
        (CONFIGMAPS, pod_body(), MEDIA_TYPE, 415, "kubectl create -f"),
        (
            CONFIGMAPS,
            envelope("apps/v1", "Deployment", ld(1, ld(1, "d"))),
            MEDIA_TYPE,
            415,
            "Deployment",
        ),
        ("/api/v1/namespaces/ns1/secrets", fixture("configmap"), MEDIA_TYPE, 400, "ConfigMap"),
        (
            "/apis/compute/v1/namespaces/ns1/servers",
            fixture("configmap"),
            MEDIA_TYPE,
            400,
            "servers",
        ),
        (CONFIGMAPS, fixture("configmap")[:-7], MEDIA_TYPE, 400, "malformed"),
        (CONFIGMAPS, fixture("configmap")[:9], MEDIA_TYPE, 400, "malformed"),
        (CONFIGMAPS, MAGIC_ONLY + b"\xff\xff\xff\xff", MEDIA_TYPE, 400, "protobuf"),
        (CONFIGMAPS, b"not protobuf at all", MEDIA_TYPE, 400, "k8s"),
        (CONFIGMAPS, b"\xa2dkindiConfigMap", "application/cbor", 415, "CBOR"),
        (CONFIGMAPS, b"\xa1", "application/apply-patch+cbor", 415, "CBOR"),
    ],
)
async def test_refused_bodies_store_and_charge_nothing(
    env: Env, path: str, body: bytes, content_type: str, code: int, says: str
) -> None:
    status, answer = await env.call(ALICE, "POST", path, body, content_type)
    assert status == code, answer
    assert answer["kind"] == "Status" and answer["code"] == code
    assert says in answer["message"]
    for resource in ("configmaps", "secrets", "pods"):
        assert await env.stored("acme", f"namespaces/ns1/{resource}") == []
    for resource in ("configmaps", "secrets", "servers"):
        assert await env.used("acme", resource) in (("0", "0"),)


async def test_protobuf_patch_is_415(env: Env) -> None:
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm1"}})
    assert status == 201, body
    status, body = await env.call(
        ALICE, "PATCH", f"{CONFIGMAPS}/cm1", fixture("configmap"), MEDIA_TYPE
    )
    assert status == 415, body
    assert body["kind"] == "Status"
    status, obj = await env.call(ALICE, "GET", f"{CONFIGMAPS}/cm1")
    assert status == 200 and "data" not in obj, obj


async def test_protobuf_with_content_encoding_is_415(env: Env) -> None:
    status, body = await env.call(
        ALICE,
        "POST",
        CONFIGMAPS,
        fixture("configmap"),
        MEDIA_TYPE,
        headers={"Content-Encoding": "gzip"},
    )
    assert status == 415, body
    assert await env.stored("acme", "namespaces/ns1/configmaps") == []

"""Kubernetes protobuf bodies through the real sidecar and the real store (DESIGN §10).

The bodies are the ones kubectl 1.32 sends (tests/fixtures/protobuf/, recorded by
tests/sidecar/test_kube_protobuf.py). A body the sidecar reads becomes JSON before any stage
sees it, and the store (which reads JSON only) stores exactly that object and the quota
charges it; every refused body — another kind, a kind sent to another resource, garbage,
a truncated body, CBOR — gets a Status and leaves nothing stored and nothing charged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.kube_protobuf import MEDIA_TYPE
from tests.rigs import paths
from tests.rigs.protobuf import envelope, ld, pod_body
from tests.rigs.stack import ALICE, BOB, CONFIGMAPS, Env, running_env

FIXTURES = paths.FIXTURES / "protobuf"


@pytest.fixture
def env(stack: Env) -> Env:
    """The conftest `stack`: store + sidecar, tenants acme and beta, a quota of 5."""
    return stack


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
    assert answer["kind"] == "Status"
    assert answer["code"] == code
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
    assert status == 200, obj
    assert "data" not in obj, obj


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

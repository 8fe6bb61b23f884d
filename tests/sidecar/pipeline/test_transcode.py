"""Kubernetes protobuf bodies through the real sidecar and the real store (DESIGN §10).

The bodies are the ones kubectl 1.32 sends (tests/fixtures/protobuf/, recorded by
tests/sidecar/services/codecs/test_kube_protobuf.py). A body the sidecar reads becomes JSON before any stage
sees it, and the store (which reads JSON only) stores exactly that object and the quota
charges it; every refused body — another kind, a kind sent to another resource, a field
the sidecar does not read, garbage, a string that is not UTF-8, a truncated body, a body
whose JSON could not fit in `limits.maxBodyBytes`, CBOR — gets a Status and leaves
nothing stored and nothing charged. A large body is read by the sidecar's worker
process (sidecar/services/codecs/kube_protobuf/offload.py) and stored the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp.test_utils import make_mocked_request

from sidecar.core.identity import Identity
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.transcode import caller_tenant
from sidecar.services.codecs.kube_protobuf import KINDS, MEDIA_TYPE, transcode
from tests.rigs import paths
from tests.rigs.protobuf import entry, envelope, finalizer_bomb, ld, meta, pod_body
from tests.rigs.stack import ADMIN, ALICE, BOB, CONFIGMAPS, Env, running_env

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
        (CONFIGMAPS, pod_body(), MEDIA_TYPE, 415, "kubectl create --raw /api/v1/tenants/acme/"),
        (
            CONFIGMAPS,
            envelope("apps/v1", "StatefulSet", ld(1, ld(1, "d"))),
            MEDIA_TYPE,
            415,
            "StatefulSet",
        ),
        (CONFIGMAPS, fixture("deployment"), MEDIA_TYPE, 400, "Deployment"),
        (
            CONFIGMAPS,
            envelope("v1", "ConfigMap", meta(ld(1, "x")) + ld(42, "a field from the future")),
            MEDIA_TYPE,
            415,
            "field 42",
        ),
        (
            CONFIGMAPS,
            envelope("v1", "ConfigMap", meta(ld(1, "x")) + entry(2, "k", b"\xff")),
            MEDIA_TYPE,
            400,
            "UTF-8",
        ),
        (CONFIGMAPS, finalizer_bomb(), MEDIA_TYPE, 413, "more entries than"),
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


# -- every kind `kubectl create` sends --------------------------------------------------------

# The store serves no policy/v1, scheduling.k8s.io/v1 or networking.k8s.io/v1 resources
# (DESIGN §10's resource table): the sidecar reads these bodies, the store answers 404.
GENERATED = [
    "configmap",
    "secret",
    "secret-docker-registry",
    "secret-tls",
    "serviceaccount",
    "deployment",
    "deployment-no-replicas",
    "service-clusterip",
    "service-nodeport",
    "service-loadbalancer",
    "service-externalname",
    "job",
    "job-from-cronjob",
    "cronjob",
    "role",
    "rolebinding",
    "clusterrole",
    "clusterrole-aggregated",
    "clusterrolebinding",
    "quota",
    "poddisruptionbudget",
    "priorityclass",
    "ingress",
]


def expected(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return doc


def collection(doc: dict[str, Any]) -> str:
    found = KINDS[(doc["apiVersion"], doc["kind"])]
    base = f"/apis/{found.group}/v1" if found.group else "/api/v1"
    namespace = doc["metadata"].get("namespace")
    return (
        f"{base}/namespaces/{namespace}/{found.resource}"
        if namespace
        else (f"{base}/{found.resource}")
    )


@pytest.mark.parametrize("name", GENERATED)
async def test_kubectl_create_bodies_are_stored_as_kubectl_meant(env: Env, name: str) -> None:
    want = expected(name)
    path = collection(want)
    token = ALICE if want["metadata"].get("namespace") else ADMIN  # cluster-scoped: operator
    status, body = await env.call(token, "POST", path, fixture(name), MEDIA_TYPE)
    assert status == 201, body
    status, stored = await env.call(token, "GET", f"{path}/{want['metadata']['name']}")
    assert status == 200, stored
    for key, value in want.items():
        if key == "metadata":
            for field in ("name", "labels", "annotations", "ownerReferences"):
                assert stored["metadata"].get(field) == value.get(field), field
        elif key == "stringData":  # the store merges it into `data`, as Kubernetes does
            continue
        else:
            assert stored[key] == value, key


async def test_a_large_body_is_read_by_the_worker_and_stored(env: Env) -> None:
    value = "x" * 400_000
    raw = meta(ld(1, "large"), ld(3, "ns1")) + entry(2, "blob", value)
    status, body = await env.call(
        ALICE, "POST", CONFIGMAPS, envelope("v1", "ConfigMap", raw), MEDIA_TYPE
    )
    assert status == 201, body
    status, stored = await env.call(ALICE, "GET", f"{CONFIGMAPS}/large")
    assert status == 200
    assert stored["data"] == {"blob": value}
    assert await env.used("acme", "configmaps") == ("1", "0")


async def test_a_review_with_an_extra_that_is_not_utf8_is_400(env: Env) -> None:
    """Issue 22: a protobuf SubjectAccessReview whose `extra` holds bytes that are not
    UTF-8 was a 500 with a traceback."""
    spec = ld(3, "bob") + ld(5, ld(1, "scopes") + ld(2, ld(1, b"\xff\xfe")))
    body = envelope("authorization.k8s.io/v1", "SubjectAccessReview", meta() + ld(2, spec))
    status, answer = await env.call(
        ADMIN, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body, MEDIA_TYPE
    )
    assert status == 400, answer
    assert answer["kind"] == "Status"
    assert "UTF-8" in answer["message"]


async def test_replicas_zero_survives_the_trip(env: Env) -> None:
    """A pointer zero (`replicas: 0`) reaches the store: dropped, Kubernetes would run one."""
    want = expected("deployment-no-replicas")
    assert want["spec"]["replicas"] == 0
    assert json.loads(transcode(fixture("deployment-no-replicas")).data)["spec"]["replicas"] == 0
    path = collection(want)
    status, body = await env.call(
        ALICE, "POST", path, fixture("deployment-no-replicas"), MEDIA_TYPE
    )
    assert status == 201, body
    assert body["spec"]["replicas"] == 0


def test_a_body_takes_the_share_of_the_tenant_that_sent_it() -> None:
    """The protobuf workers are shared per tenant as the rate limit counts: by the
    caller's tenant, not by a tenant it impersonates (an operator impersonating an acme
    user spends the operator tenant's share, never acme's)."""
    ctx = RequestContext(
        request=make_mocked_request("POST", "/x"),
        request_id="req-1",
        policy=cast(Any, SimpleNamespace(revision="rev-0")),
        max_body_bytes=10,
    )
    assert caller_tenant(ctx) == ""  # no identity (never past the identity stage)
    operator = Identity("admin", "system", (), "static-token")
    ctx.identity = operator
    assert caller_tenant(ctx) == "system"
    ctx.identity = Identity("alice", "acme", (), "static-token", impersonated_by=operator)
    assert caller_tenant(ctx) == "system"

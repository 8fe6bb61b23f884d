"""Kubernetes protobuf bodies → Kubernetes JSON (sidecar/kube_protobuf.py, DESIGN §10).

The bodies are the real ones: `kubectl` (1.32) is pointed at a stub API server that
serves just enough discovery and records what kubectl POSTs. The same bodies are kept
under tests/fixtures/protobuf/ so the decoding tests run where kubectl is absent; the
live tests skip only there, and never under CI=true. Hand-encoded bodies (a tiny wire
encoder below, independent of the module's descriptors) cover fields kubectl does not
send, and the bad input of issue 14.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.errors import StatusError
from sidecar.kube_protobuf import MAGIC, MEDIA_TYPE, ProtobufError, transcode
from tests.rigs import paths
from tests.rigs.protobuf import entry, envelope, ld, meta, pod_body, vi

FIXTURES = paths.FIXTURES / "protobuf"
BLOB = b"\x00\xff\xfebinary"  # not UTF-8, so kubectl puts it in binaryData

# name → (kubectl arguments, the path kubectl POSTs to, the JSON the body stands for).
# "{blob}" in an argument is a file holding BLOB.
CASES: dict[str, tuple[list[str], str, dict[str, Any]]] = {
    "configmap": (
        ["create", "configmap", "cm1", "--from-literal=a=b", "--from-file=bin={blob}", "-n", "ns1"],
        "/api/v1/namespaces/ns1/configmaps",
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": "cm1", "namespace": "ns1"},
            "data": {"a": "b"},
            "binaryData": {"bin": base64.b64encode(BLOB).decode()},
        },
    ),
    "secret": (
        [
            "create",
            "secret",
            "generic",
            "s1",
            "--from-literal=k=v",
            "--from-file=bin={blob}",
            "--type=example.com/kind",
            "-n",
            "ns1",
        ],
        "/api/v1/namespaces/ns1/secrets",
        {
            "kind": "Secret",
            "apiVersion": "v1",
            "metadata": {"name": "s1", "namespace": "ns1"},
            "data": {"bin": base64.b64encode(BLOB).decode(), "k": "dg=="},
            "type": "example.com/kind",
        },
    ),
    "namespace": (
        ["create", "namespace", "ns2"],
        "/api/v1/namespaces",
        {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {"name": "ns2"},
            "spec": {},
            "status": {},
        },
    ),
    "serviceaccount": (
        ["create", "serviceaccount", "sa1", "-n", "ns1"],
        "/api/v1/namespaces/ns1/serviceaccounts",
        {
            "kind": "ServiceAccount",
            "apiVersion": "v1",
            "metadata": {"name": "sa1", "namespace": "ns1"},
        },
    ),
    "ssar": (
        ["auth", "can-i", "get", "pods", "-n", "ns1"],
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {},
            "spec": {"resourceAttributes": {"namespace": "ns1", "verb": "get", "resource": "pods"}},
            "status": {"allowed": False},
        },
    ),
    "ssar-subresource": (
        ["auth", "can-i", "create", "pods", "--subresource=exec", "-n", "ns1"],
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {},
            "spec": {
                "resourceAttributes": {
                    "namespace": "ns1",
                    "verb": "create",
                    "resource": "pods",
                    "subresource": "exec",
                }
            },
            "status": {"allowed": False},
        },
    ),
    "ssar-nonresource": (
        ["auth", "can-i", "get", "/logs"],
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {},
            "spec": {"nonResourceAttributes": {"path": "/logs", "verb": "get"}},
            "status": {"allowed": False},
        },
    ),
    "ssrr": (
        ["auth", "can-i", "--list", "-n", "ns1"],
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        {
            "kind": "SelfSubjectRulesReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {},
            "spec": {"namespace": "ns1"},
            "status": {"incomplete": False},
        },
    ),
    "ssr": (
        ["auth", "whoami"],
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {
            "kind": "SelfSubjectReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {},
            "status": {"userInfo": {}},
        },
    ),
}


# ---- the stub API server kubectl talks to ----------------------------------------------


def _resources(group_version: str, rows: list[tuple[str, str, bool, list[str]]]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": name,
                "singularName": name[:-1],
                "namespaced": namespaced,
                "kind": kind,
                "verbs": verbs,
            }
            for name, kind, namespaced, verbs in rows
        ],
    }


_CRUD = ["create", "get", "list", "delete"]
DISCOVERY: dict[str, dict[str, Any]] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/api/v1": _resources(
        "v1",
        [
            ("configmaps", "ConfigMap", True, _CRUD),
            ("secrets", "Secret", True, _CRUD),
            ("namespaces", "Namespace", False, _CRUD),
            ("serviceaccounts", "ServiceAccount", True, _CRUD),
            ("pods", "Pod", True, _CRUD),
        ],
    ),
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": group,
                "versions": [{"groupVersion": f"{group}/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": f"{group}/v1", "version": "v1"},
            }
            for group in ("authorization.k8s.io", "authentication.k8s.io")
        ],
    },
    "/apis/authorization.k8s.io/v1": _resources(
        "authorization.k8s.io/v1",
        [
            ("selfsubjectaccessreviews", "SelfSubjectAccessReview", False, ["create"]),
            ("selfsubjectrulesreviews", "SelfSubjectRulesReview", False, ["create"]),
            ("subjectaccessreviews", "SubjectAccessReview", False, ["create"]),
        ],
    ),
    "/apis/authentication.k8s.io/v1": _resources(
        "authentication.k8s.io/v1",
        [
            ("selfsubjectreviews", "SelfSubjectReview", False, ["create"]),
        ],
    ),
    "/version": {"major": "1", "minor": "32", "gitVersion": "v1.32.0"},
}

# What the stub answers to each POST, by the last path segment: a well-formed object of
# the posted kind, so that kubectl exits 0 and the test knows it sent what it meant to.
ANSWERS: dict[str, dict[str, Any]] = {
    "configmaps": {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "cm1"}},
    "secrets": {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": "s1"}},
    "namespaces": {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "ns2"}},
    "serviceaccounts": {"kind": "ServiceAccount", "apiVersion": "v1", "metadata": {"name": "sa1"}},
    "selfsubjectaccessreviews": {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "status": {"allowed": True},
    },
    "selfsubjectrulesreviews": {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "status": {"resourceRules": [], "nonResourceRules": [], "incomplete": False},
    },
    "selfsubjectreviews": {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "status": {"userInfo": {"username": "alice"}},
    },
}


class Recorder:
    """The stub server's record of the POSTs it got: (path, Content-Type, body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, bytes]] = []

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            if request.method == "GET":
                doc = DISCOVERY.get(request.path)
                if doc is None:
                    return web.json_response({"kind": "Status", "code": 404}, status=404)
                return web.json_response(doc)
            self.posts.append((request.path, request.content_type, await request.read()))
            return web.json_response(ANSWERS[request.path.rsplit("/", 1)[-1]], status=201)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app


def kubectl_home(home: Path, port: int) -> tuple[dict[str, str], Path]:
    """A HOME with a kubeconfig for the stub at 127.0.0.1:port and the BLOB file."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: stub, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: anyone, user: {}}]\n"
        "contexts: [{name: stub, context: {cluster: stub, user: anyone}}]\n"
        "current-context: stub\n"
    )
    blob = home / "blob"
    blob.write_bytes(BLOB)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(config)}
    return env, blob


async def run_kubectl(kubectl: str, args: list[str], port: int, home: Path) -> None:
    """One kubectl command against the stub at 127.0.0.1:port; fails the test on error."""
    env, blob = kubectl_home(home, port)
    proc = await asyncio.create_subprocess_exec(
        kubectl,
        *[a.replace("{blob}", str(blob)) for a in args],
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"kubectl {args} did not finish within 60 s")
    assert proc.returncode == 0, f"kubectl {args}: {out.decode()} {err.decode()}"


async def capture(
    kubectl: str, args: list[str], aiohttp_server: Any, home: Path
) -> tuple[str, str, bytes]:
    """The one POST that `kubectl args` sends."""
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    await run_kubectl(kubectl, args, server.port, home)
    assert len(recorder.posts) == 1, recorder.posts
    return recorder.posts[0]


# ---- real kubectl ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
async def test_kubectl_body_transcodes(
    name: str, aiohttp_server: Any, tmp_path: Path, kubectl_binary: str
) -> None:
    kubectl = kubectl_binary
    args, path, expected = CASES[name]
    posted_path, content_type, body = await capture(kubectl, args, aiohttp_server, tmp_path)
    assert posted_path == path
    assert content_type == MEDIA_TYPE  # kubectl 1.32 sends protobuf for these commands
    kind, document = transcode(body)
    assert kind == expected["kind"]
    assert json.loads(document) == expected


@pytest.mark.parametrize("name", sorted(CASES))
async def test_fixture_is_what_kubectl_sends(
    name: str, aiohttp_server: Any, tmp_path: Path, kubectl_binary: str
) -> None:
    """The committed fixture decodes like today's kubectl body (kubectl may reorder maps)."""
    kubectl = kubectl_binary
    _, _, body = await capture(kubectl, CASES[name][0], aiohttp_server, tmp_path)
    assert transcode(body) == transcode((FIXTURES / f"{name}.pb").read_bytes())


# ---- the captured fixtures, without kubectl --------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_transcodes(name: str) -> None:
    expected = CASES[name][2]
    kind, document = transcode((FIXTURES / f"{name}.pb").read_bytes())
    assert kind == expected["kind"]
    assert json.loads(document) == expected


# ---- hand-encoded bodies: fields kubectl's commands do not send --------------------------


def test_object_meta_fields() -> None:
    owner = ld(
        13,
        ld(1, "Deployment") + ld(3, "web") + ld(4, "u-1") + ld(5, "apps/v1") + vi(6, 1) + vi(7, 0),
    )
    raw = (
        meta(
            ld(2, "gen-"),
            ld(3, "ns1"),
            ld(8, vi(1, 1700000000) + vi(2, 5)),
            vi(10, 0),
            entry(11, "app", "web"),
            entry(11, "tier", "front"),
            entry(12, "note", "x y"),
            owner,
            ld(14, "example.com/f"),
            ld(
                17,
                ld(1, "kubectl")
                + ld(2, "Update")
                + ld(3, "v1")
                + ld(6, "FieldsV1")
                + ld(7, ld(1, b'{"f:data":{}}')),
            ),
        )
        + entry(2, "k", "v")
        + vi(4, 1)
    )
    _, document = transcode(envelope("v1", "ConfigMap", raw))
    assert json.loads(document) == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "gen-",
            "namespace": "ns1",
            "creationTimestamp": "2023-11-14T22:13:20Z",
            "deletionGracePeriodSeconds": 0,
            "labels": {"app": "web", "tier": "front"},
            "annotations": {"note": "x y"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "web",
                    "uid": "u-1",
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
            "finalizers": ["example.com/f"],
            "managedFields": [
                {
                    "manager": "kubectl",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:data": {}},
                }
            ],
        },
        "immutable": True,
        "data": {"k": "v"},
    }


def test_secret_string_data_and_explicit_false() -> None:
    raw = meta(ld(1, "s")) + entry(4, "user", "admin") + ld(3, "") + vi(5, 0)
    _, document = transcode(envelope("v1", "Secret", raw))
    assert json.loads(document) == {
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {"name": "s"},
        "immutable": False,
        "stringData": {"user": "admin"},
    }


def test_service_account_references() -> None:
    raw = (
        meta(ld(1, "sa"), ld(3, "ns1"))
        + ld(2, ld(1, "Secret") + ld(3, "tok"))
        + ld(3, ld(1, "pull"))
        + vi(4, 0)
    )
    _, document = transcode(envelope("v1", "ServiceAccount", raw))
    assert json.loads(document) == {
        "kind": "ServiceAccount",
        "apiVersion": "v1",
        "metadata": {"name": "sa", "namespace": "ns1"},
        "secrets": [{"kind": "Secret", "name": "tok"}],
        "imagePullSecrets": [{"name": "pull"}],
        "automountServiceAccountToken": False,
    }


def test_subject_access_review() -> None:
    attrs = (
        ld(1, "ns1")
        + ld(2, "list")
        + ld(3, "apps")
        + ld(4, "v1")
        + ld(5, "deployments")
        + ld(8, ld(1, "metadata.name=web"))
        + ld(9, ld(2, ld(1, "app") + ld(2, "In") + ld(3, "a") + ld(3, "b")))
    )
    spec = (
        ld(1, attrs)
        + ld(3, "bob")
        + ld(4, "devs")
        + ld(4, "ops")
        + ld(5, ld(1, "scopes") + ld(2, ld(1, "read") + ld(1, "write")))
        + ld(6, "uid-7")
    )
    _, document = transcode(
        envelope("authorization.k8s.io/v1", "SubjectAccessReview", meta() + ld(2, spec))
    )
    assert json.loads(document) == {
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {},
        "spec": {
            "resourceAttributes": {
                "namespace": "ns1",
                "verb": "list",
                "group": "apps",
                "version": "v1",
                "resource": "deployments",
                "fieldSelector": {"rawSelector": "metadata.name=web"},
                "labelSelector": {
                    "requirements": [{"key": "app", "operator": "In", "values": ["a", "b"]}]
                },
            },
            "user": "bob",
            "groups": ["devs", "ops"],
            "extra": {"scopes": ["read", "write"]},
            "uid": "uid-7",
        },
    }


def test_error_is_a_status_error() -> None:
    with pytest.raises(StatusError) as caught:
        transcode(envelope("v1", "Pod", meta(ld(1, "p"))))
    body = json.loads(caught.value.response().body)  # type: ignore[arg-type]
    assert (body["kind"], body["code"], body["reason"]) == ("Status", 415, "UnsupportedMediaType")


# ---- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (pod_body(), "Pod"),
        (envelope("apps/v1", "Deployment", meta(ld(1, "d"))), "Deployment"),
        (envelope("v1", "Pod", b"\xff\xff not even protobuf"), "Pod"),  # the kind decides first
        (
            envelope("authorization.k8s.io/v1beta1", "SelfSubjectAccessReview", meta()),
            "SelfSubjectAccessReview (authorization.k8s.io/v1beta1)",
        ),
    ],
)
def test_other_kind_is_415_naming_it(body: bytes, kind: str) -> None:
    with pytest.raises(ProtobufError) as caught:
        transcode(body)
    assert caught.value.code == 415
    assert kind in caught.value.message
    assert "kubectl create -f" in caught.value.message


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "empty"),
        (b"k8s", "short magic"),
        (b'{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}', "JSON, no magic"),
        (b"\xd9\xd9\xf7\xa2dkindiConfigMapjapiVersionbv1", "CBOR (self-described)"),
        (b"\x0a\x0f\x0a\x02v1\x12\x09ConfigMap", "an envelope without the magic"),
        (MAGIC, "magic only"),
        (MAGIC + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "garbage after the magic"),
        (MAGIC + b"garbage garbage", "text after the magic"),
        (MAGIC + ld(2, meta(ld(1, "x"))), "no typeMeta"),
        (envelope("v1", "", meta()), "empty kind"),
        (MAGIC + ld(1, ld(1, "v1") + ld(2, "ConfigMap")), "an envelope cut before its object"),
        (envelope("v1", "ConfigMap", b"\x0a\x80"), "the object is truncated"),
        (envelope("v1", "ConfigMap", meta(ld(1, b"\xff\xfe"))), "a name that is not UTF-8"),
        (envelope("v1", "ConfigMap", entry(2, "k", b"\xc3")), "a value that is not UTF-8"),
        (envelope("v1", "ConfigMap", meta(ld(8, vi(1, 2**62)))), "a timestamp out of range"),
        (MAGIC + b"\x2b" * 100_000, "groups nested past any depth limit"),
        (envelope("v1", "ConfigMap", b"\x2b" * 100_000), "the same inside the object"),
        (envelope("v1", "ConfigMap", meta(ld(17, ld(7, ld(1, b"1"))))), "fieldsV1 not an object"),
        (
            envelope("v1", "ConfigMap", meta(ld(17, ld(7, ld(1, b"[" * 100_000))))),
            "fieldsV1 too deep",
        ),
    ],
)
def test_malformed_body_is_400(body: bytes, why: str) -> None:
    with pytest.raises(ProtobufError) as caught:
        transcode(body)
    assert caught.value.code == 400, why


def test_content_encoding_is_415() -> None:
    with pytest.raises(ProtobufError) as caught:
        transcode(envelope("v1", "ConfigMap", meta(), encoding="gzip"))
    assert caught.value.code == 415


def test_every_truncation_of_a_real_body_is_400_or_the_same_object() -> None:
    """Cutting a field in half is a 400; cutting between trailing empty fields is harmless."""
    body = (FIXTURES / "configmap.pb").read_bytes()
    full = transcode(body)
    for cut in range(len(body)):
        try:
            result = transcode(body[:cut])
        except ProtobufError as exc:
            assert exc.code == 400, cut  # noqa: PT017 (either outcome is allowed; pytest.raises cannot say that)
        else:
            assert result == full, cut
    with pytest.raises(ProtobufError):
        transcode(body[: len(body) // 2])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_after_magic_never_crash(tail: bytes) -> None:
    try:
        transcode(MAGIC + tail)
    except ProtobufError as exc:
        assert exc.code in (400, 415)  # noqa: PT017 (either outcome is allowed; pytest.raises cannot say that)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(CASES)), st.data())
def test_mutated_real_bodies_never_crash(name: str, data: st.DataObject) -> None:
    body = bytearray((FIXTURES / f"{name}.pb").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(len(MAGIC), len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    try:
        kind, document = transcode(bytes(body))
    except ProtobufError as exc:
        assert exc.code in (400, 415)  # noqa: PT017 (either outcome is allowed; pytest.raises cannot say that)
    else:
        assert json.loads(document)["kind"] == kind

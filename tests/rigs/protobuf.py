"""Kubernetes protobuf bodies for tests: a tiny wire encoder (independent of
sidecar/kube_protobuf's descriptors) for fields kubectl does not send and for bad input,
and `KubectlStub`, a stub API server that records what the real kubectl POSTs."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sidecar.services.codecs.kube_protobuf import MAGIC, transcode

# ---- the wire encoder -------------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(field << 3 | 2) + varint(len(data)) + data


def vi(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value)


def entry(field: int, key: str | bytes, value: bytes | str) -> bytes:
    return ld(field, ld(1, key) + ld(2, value))


def envelope(api_version: str, kind: str, raw: bytes, encoding: str = "", ctype: str = "") -> bytes:
    return (
        MAGIC
        + ld(1, ld(1, api_version) + ld(2, kind))
        + ld(2, raw)
        + ld(3, encoding)
        + ld(4, ctype)
    )


def meta(*fields: bytes) -> bytes:
    # Like Go: every non-pointer field written, zero or not, then the given ones.
    zeros = (
        ld(1, "")
        + ld(2, "")
        + ld(3, "")
        + ld(4, "")
        + ld(5, "")
        + ld(6, "")
        + vi(7, 0)
        + ld(8, b"")
    )
    return ld(1, zeros + b"".join(fields))


def pod_body() -> bytes:
    container = ld(1, "c") + ld(2, "nginx")
    return envelope("v1", "Pod", meta(ld(1, "p"), ld(3, "ns1")) + ld(2, ld(2, container)))


def finalizer_bomb(entries: int = 1_572_000) -> bytes:
    """The hostile body of issue 22: a ConfigMap of ~3 MiB whose metadata holds
    `entries` empty finalizers (2 bytes each on the wire, `"",` each in JSON)."""
    return envelope("v1", "ConfigMap", meta(ld(1, "bomb"), ld(14, "") * entries))


def map_bomb(entries: int = 1_572_000) -> bytes:
    """A ConfigMap whose `data` map has `entries` empty entries (2 bytes each)."""
    return envelope("v1", "ConfigMap", meta(ld(1, "bomb")) + ld(2, b"") * entries)


# ---- the stub API server kubectl talks to ----------------------------------------------


def _resources(group_version: str, rows: list[tuple[str, str, bool]]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": name,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["create", "get", "list", "delete"],
            }
            for name, kind, namespaced in rows
        ],
    }


_GROUPS: dict[str, list[tuple[str, str, bool]]] = {
    "apps/v1": [("deployments", "Deployment", True)],
    "batch/v1": [("jobs", "Job", True), ("cronjobs", "CronJob", True)],
    "rbac.authorization.k8s.io/v1": [
        ("roles", "Role", True),
        ("rolebindings", "RoleBinding", True),
        ("clusterroles", "ClusterRole", False),
        ("clusterrolebindings", "ClusterRoleBinding", False),
    ],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "scheduling.k8s.io/v1": [("priorityclasses", "PriorityClass", False)],
    "networking.k8s.io/v1": [("ingresses", "Ingress", True)],
    "authorization.k8s.io/v1": [
        ("selfsubjectaccessreviews", "SelfSubjectAccessReview", False),
        ("selfsubjectrulesreviews", "SelfSubjectRulesReview", False),
        ("subjectaccessreviews", "SubjectAccessReview", False),
    ],
    "authentication.k8s.io/v1": [("selfsubjectreviews", "SelfSubjectReview", False)],
}
DISCOVERY: dict[str, dict[str, Any]] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/api/v1": _resources(
        "v1",
        [
            ("configmaps", "ConfigMap", True),
            ("secrets", "Secret", True),
            ("namespaces", "Namespace", False),
            ("serviceaccounts", "ServiceAccount", True),
            ("services", "Service", True),
            ("resourcequotas", "ResourceQuota", True),
            ("pods", "Pod", True),
            ("nodes", "Node", False),
        ],
    ),
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": gv.split("/")[0],
                "versions": [{"groupVersion": gv, "version": "v1"}],
                "preferredVersion": {"groupVersion": gv, "version": "v1"},
            }
            for gv in _GROUPS
        ],
    },
    **{f"/apis/{gv}": _resources(gv, rows) for gv, rows in _GROUPS.items()},
    "/version": {"major": "1", "minor": "32", "gitVersion": "v1.32.0"},
}

# What the stub answers to each review POST (the other POSTs get their own object back).
REVIEW_ANSWERS: dict[str, dict[str, Any]] = {
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


@dataclass
class Post:
    path: str
    content_type: str
    body: bytes


@dataclass
class KubectlStub:
    """Just enough of an API server for kubectl's typed commands: discovery, the
    objects in `objects` (path → JSON) for GETs, and every POST recorded and answered
    with the posted object (as JSON, which kubectl accepts)."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    posts: list[Post] = field(default_factory=list)

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            if request.method == "GET":
                doc = DISCOVERY.get(request.path) or self.objects.get(request.path)
                if doc is None:
                    return web.json_response({"kind": "Status", "code": 404}, status=404)
                return web.json_response(doc)
            body = await request.read()
            self.posts.append(Post(request.path, request.content_type, body))
            answer = REVIEW_ANSWERS.get(request.path.rsplit("/", 1)[-1])
            if answer is not None:
                return web.json_response(answer, status=201)
            return web.Response(
                body=transcode(body).data, status=201, content_type="application/json"
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app


def kubectl_home(home: Path, server: str) -> dict[str, str]:
    """The environment of a kubectl that talks to `server` with no credentials."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: stub, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: anyone, user: {}}]\n"
        "contexts: [{name: stub, context: {cluster: stub, user: anyone}}]\n"
        "current-context: stub\n"
    )
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "KUBECONFIG": str(config),
        "KUBECACHEDIR": str(home / "cache"),
    }


async def run_kubectl(kubectl: str, args: list[str], env: dict[str, str]) -> str:
    """One kubectl command; its stdout. Fails the test on an error or after 60 s."""
    proc = await asyncio.create_subprocess_exec(
        kubectl, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"kubectl {args} did not finish within 60 s")
    assert proc.returncode == 0, f"kubectl {args}: {out.decode()} {err.decode()}"
    return out.decode()


def client_dry_run(args: list[str]) -> list[str]:
    """`args` with `--dry-run=client -o json` (before any `--` and its command)."""
    cut = args.index("--") if "--" in args else len(args)
    return [*args[:cut], "--dry-run=client", "-o", "json", *args[cut:]]


def as_json(text: str) -> Any:
    return json.loads(text)

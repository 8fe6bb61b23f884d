"""The decision service against the full proxy (DESIGN §13): one corpus of requests
(identities, verbs, targets, encodings, spoofed identity, impersonation and route
headers, owner rules) through the full proxy, real Envoy (HTTP and gRPC ext_authz) and
real nginx from the generated configs: the same status and body everywhere; each
request a front forwarded itself carries the request line and identity headers the
proxy's forward carried; writes, watches and owner-filtered lists reach the store only
through the proxy; a tenant's rate limit is charged once whichever way a request goes;
quota exact through every front; SubjectAccessReviews (v1, v1beta1, Arktos); malformed
questions and a decider that is down never allow."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from multidict import CIMultiDict
from yarl import URL

from sidecar.cli.fronts_launch import envoy_binary, nginx_binary, start_envoy, start_nginx
from sidecar.cli.launch import HOST, ProcessGroup, StartError, free_port
from tests.rigs.fronts import CORPUS_HEADER, Fronts, running_fronts
from tests.rigs.policies import EVERYTHING

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _fronts_installed() -> str:
    """What is missing of Envoy and nginx ("" when both are there)."""
    try:
        envoy_binary()
        nginx_binary()
    except StartError as exc:
        return str(exc)
    return ""


_MISSING = _fronts_installed()
if _MISSING:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {_MISSING}", pytrace=False)
    pytest.skip(_MISSING, allow_module_level=True)

POLICY = (
    EVERYTHING
    + """\
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
kind: ClusterRole
metadata: {name: view-cm}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch]}
---
kind: TenantRoleBinding
metadata: {name: viewers, tenant: acme}
roleRef: {kind: ClusterRole, name: view-cm}
subjects: [{kind: Group, name: viewers}]
---
kind: ClusterRole
metadata: {name: node-owner}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get, list], when: owner}
---
kind: TenantRoleBinding
metadata: {name: node-owners, tenant: acme}
roleRef: {kind: ClusterRole, name: node-owner}
subjects: [{kind: Group, name: node-owners}]
---
kind: QuotaDefaults
metadata: {name: defaults}
spec: {hard: {configmaps: 3}}
"""
)
SLOW = ("slow1", "slow2", "slow3", "slow4")
QUOTA = ("q1", "q2", "q3", "q4")
for _t in SLOW:
    POLICY += (
        f"---\nkind: RateLimit\nmetadata: {{name: {_t}}}\n"
        f"spec: {{tenant: {_t}, rate: 0.001, burst: 6}}\n"
        f"---\nkind: TenantRoleBinding\nmetadata: {{name: {_t}-view, tenant: {_t}}}\n"
        "roleRef: {kind: ClusterRole, name: view-cm}\n"
        f"subjects: [{{kind: User, name: sam}}]\n"
    )

TOKENS: list[dict[str, Any]] = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "alice", "user": "alice", "tenant": "acme", "groups": ["devs"]},
    {"token": "bob", "user": "bob", "tenant": "beta", "groups": []},
    {"token": "carol", "user": "carol", "tenant": "acme", "groups": ["viewers", "x"]},
    {"token": "dave", "user": "dave", "tenant": "acme", "groups": ["node-owners"]},
    {"token": "erin", "user": "erin", "tenant": "acme", "groups": ["viewers", "a,b"]},
] + [{"token": f"sam-{t}", "user": "sam", "tenant": t, "groups": []} for t in SLOW]

CM = "/api/v1/tenants/acme/namespaces/ns1/configmaps"
READS = [
    CM,
    CM + "/cm0",
    CM + "/nope",
    "/api/v1/tenants/beta/namespaces/ns1/configmaps/cm0",
    "/api/v1/tenants/ghost/namespaces/ns1/configmaps/cm0",
    "/api/v1/namespaces/ns1/configmaps",
    CM + "?labelSelector=a%3Db",
    CM + "?labelSelector=a=b&limit=5",
    "/api/v1/%74enants/acme/namespaces/ns1/configmaps",
    CM + "?watch=1&watch=1",
    CM + "/a%2Fb",
    "/api/v1/tenants/acme/namespaces/../x",
    CM + "#frag",
    "/api/v1/nodes",
    "/api/v1/nodes/n1",
    "/api/v1/nodes/n2",
    "/api/v1/tenants/acme/namespaces/ns1/secrets",
    "/version",
    "/apis",
    "/quota/v1/tenants/acme",
    "/api/v1/configmaps",
]
WRITES = [
    ("DELETE", CM + "/nope", None),
    ("PATCH", "/api/v1/tenants/beta/namespaces/ns1/configmaps/nope", {"data": {"x": "1"}}),
    ("PUT", CM + "/cm0", {"metadata": {"name": "other"}}),
]
SPOOFS: list[list[tuple[str, str]]] = [
    [
        ("X-Remote-User", "admin"),
        ("X-Remote-Tenant", "system"),
        ("X-Remote-Group", "system:masters"),
    ],
    [("X_Remote_User", "admin")],
    [("Impersonate-User", "admin")],
    [("Impersonate-User", "bob"), ("Impersonate-Extra-Tenant", "beta")],
    # Two groups: Envoy joins them into one value for its check.
    [("Impersonate-User", "carol"), ("Impersonate-Group", "viewers"), ("Impersonate-Group", "x")],
    [("x-sidecar-route", "direct")],
    [("x-sidecar-decided", "9999999999." + "0" * 64)],
]
IDENTITIES = [None, "not-a-token", "admin", "alice", "bob", "carol", "dave", "erin"]
REFUSAL_HEADERS = ("www-authenticate", "content-type")


async def _call(
    http: aiohttp.ClientSession,
    base: str,
    method: str,
    target: str,
    token: str | None,
    extra: dict[str, str] | list[tuple[str, str]] | None = None,
    body: Any = None,
    tag: str = "",
) -> tuple[int, bytes, Any]:
    headers = CIMultiDict[str]({CORPUS_HEADER: tag} if tag else {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    headers.extend(extra.items() if isinstance(extra, dict) else (extra or []))
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = (
            "application/merge-patch+json" if method == "PATCH" else ("application/json")
        )
    async with http.request(
        method,
        URL(base + target, encoded=True),
        headers=headers,
        data=data,
        allow_redirects=False,
    ) as r:
        return r.status, await r.read(), r.headers


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fronts(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fronts]:
    tmp = tmp_path_factory.mktemp("fronts")
    # Every entrance's clients come from 127.0.0.1: one anonymous bucket for all of
    # them would make the corpus's unauthenticated requests race each other.
    anonymous = {"anonymous": {"rate": 100000, "burst": 100000}}
    async with running_fronts(tmp, POLICY, TOKENS, rateLimit=anonymous) as running:
        async with aiohttp.ClientSession() as http:
            admin = running.proxy
            for tenant in ("acme", "beta", *SLOW, *QUOTA):
                status, body, _ = await _call(
                    http,
                    admin,
                    "POST",
                    "/api/v1/tenants",
                    "admin",
                    body={"metadata": {"name": tenant}},
                )
                assert status == 201, body
                status, body, _ = await _call(
                    http,
                    admin,
                    "POST",
                    f"/api/v1/tenants/{tenant}/namespaces",
                    "admin",
                    body={"metadata": {"name": "ns1"}},
                )
                assert status == 201, body
            for tenant in ("acme", "beta"):
                status, body, _ = await _call(
                    http,
                    admin,
                    "POST",
                    f"/api/v1/tenants/{tenant}/namespaces/ns1/configmaps",
                    "admin",
                    body={"metadata": {"name": "cm0"}, "data": {"a": "b"}},
                )
                assert status == 201, body
            for name, owner in (("n1", "acme"), ("n2", "beta")):
                status, body, _ = await _call(
                    http,
                    admin,
                    "POST",
                    "/api/v1/nodes",
                    "admin",
                    body={"metadata": {"name": name}, "spec": {"owner": owner}},
                )
                assert status == 201, body
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


Case = tuple[str, str, str | None, list[tuple[str, str]], Any]


def _corpus() -> list[Case]:
    cases: list[Case] = []
    for token in IDENTITIES:
        for target in READS:
            cases.append(("GET", target, token, [], None))
        cases.append(("HEAD", CM + "/cm0", token, [], None))
        for method, target, body in WRITES:
            cases.append((method, target, token, [], body))
    for token in ("alice", "carol", None):
        for spoof in SPOOFS:
            cases.append(("GET", CM + "/cm0", token, spoof, None))
            cases.append(("GET", CM, token, spoof, None))
    return cases


async def test_every_front_answers_as_the_proxy(
    fronts: Fronts, http: aiohttp.ClientSession
) -> None:
    mismatches = []
    for n, (method, target, token, extra, body) in enumerate(_corpus()):
        answers = {}
        for name, base in fronts.entrances.items():
            status, data, headers = await _call(
                http, base, method, target, token, extra, body, tag=f"{n}-{name}"
            )
            # A refusal's headers too: the challenge once, the Status's media type (not
            # for HEAD: Envoy drops the Content-Type of an answer without a body).
            compared = ("www-authenticate",) if method == "HEAD" else REFUSAL_HEADERS
            kept = sorted(
                (k.lower(), v.partition(";")[0])
                for k, v in headers.items()
                if status >= 400 and k.lower() in compared
            )
            answers[name] = (status, data, kept)
        want = answers["proxy"]
        assert want[0] < 500, (method, target, token, want)
        for name, got in answers.items():
            if got != want:
                mismatches.append((method, target, token, extra, name, want, got))
        # What a front forwarded itself is what the proxy forwarded for it.
        proxy_forward = fronts.proxy_relay.by_corpus(f"{n}-proxy")
        for name in ("envoy", "envoy-grpc", "nginx"):
            for direct in fronts.direct_relay.by_corpus(f"{n}-{name}"):
                assert method in ("GET", "HEAD"), (name, method, target)
                assert len(proxy_forward) == 1, (name, method, target, token)
                assert (direct.method, direct.target) == (
                    proxy_forward[0].method,
                    proxy_forward[0].target,
                ), (name, target)
                assert direct.identity() == proxy_forward[0].identity(), (name, target, token)
                assert direct.identity_like() == [], (name, target, extra)
                # Spoofed requests go to the proxy; the fronts drop `_` header names.
                assert all("_" in k for k, _ in extra), (name, target, extra)
    assert not mismatches, "\n".join(map(repr, mismatches[:10]))
    # The fronts did forward by themselves (the fast path exists), and only reads.
    forwarded = fronts.direct_relay.seen
    assert {s.corpus.rsplit("-", 1)[-1] for s in forwarded} >= {"envoy", "grpc", "nginx"}


async def test_writes_watches_and_filtered_lists_reach_the_store_only_through_the_proxy(
    fronts: Fronts, http: aiohttp.ClientSession
) -> None:
    for name, base in fronts.entrances.items():
        tag = f"w-{name}"
        status, data, _ = await _call(
            http,
            base,
            "GET",
            CM + "?watch=true&timeoutSeconds=1",
            "alice",
            tag=tag + "-watch",
        )
        assert status == 200, (name, status, data[:200])
        status, data, _ = await _call(
            http, base, "GET", "/api/v1/nodes", "dave", tag=tag + "-filtered"
        )
        assert status == 200, (name, status, data)
        names = [i["metadata"]["name"] for i in json.loads(data)["items"]]
        assert names == ["n1"], (name, names)
        status, data, _ = await _call(
            http,
            base,
            "POST",
            "/api/v1/tenants/beta/namespaces/ns1/secrets",
            "bob",
            body={"metadata": {"name": f"made-by-{name}"}},
            tag=tag + "-create",
        )
        assert status == 201, (name, status, data)
    for seen in fronts.direct_relay.seen:
        assert not seen.corpus.startswith("w-"), (seen.method, seen.target, seen.corpus)
    for kind in ("watch", "filtered", "create"):
        for name in fronts.entrances:
            assert len(fronts.proxy_relay.by_corpus(f"w-{name}-{kind}")) == 1, (name, kind)


async def test_rate_limit_is_charged_once_whichever_way(
    fronts: Fronts, http: aiohttp.ClientSession
) -> None:
    """Burst 6, no refill to speak of: 3 requests the decider sends to the proxy and
    5 it lets the front forward, through each front: exactly 6 pass. A second charge
    in the proxy would refuse more."""
    for tenant, (name, base) in zip(SLOW, fronts.entrances.items(), strict=True):
        token = f"sam-{tenant}"
        statuses = []
        refusals = set()
        for target in ["/api/v1/namespaces/ns1/configmaps"] * 3 + [
            f"/api/v1/tenants/{tenant}/namespaces/ns1/configmaps"
        ] * 5:
            status, data, headers = await _call(http, base, "GET", target, token)
            statuses.append(status)
            if status == 429:
                assert "Retry-After" in headers, (name, headers)
                assert "RateLimit-Limit" in headers, (name, headers)
                refusals.add(json.loads(data)["reason"])
        assert statuses.count(200) == 6, (name, statuses)
        assert statuses.count(429) == 2, (name, statuses)
        assert refusals == {"TooManyRequests"}, (name, statuses)


async def test_quota_is_exact_through_every_front(
    fronts: Fronts, http: aiohttp.ClientSession
) -> None:
    for tenant, (name, base) in zip(QUOTA, fronts.entrances.items(), strict=True):
        target = f"/api/v1/tenants/{tenant}/namespaces/ns1/configmaps"
        answers = await asyncio.gather(
            *(
                _call(http, base, "POST", target, "admin", body={"metadata": {"name": f"c{i}"}})
                for i in range(6)
            )
        )
        statuses = sorted(a[0] for a in answers)
        assert statuses == [201, 201, 201, 403, 403, 403], (name, statuses)
        status, data, _ = await _call(http, fronts.store, "GET", target, None)
        assert status == 200, (name, data)
        assert len(json.loads(data)["items"]) == 3, (name, data)


def _sar(version: str, user: str, groups: list[str], attrs: dict[str, Any], extra: Any) -> Any:
    spec: dict[str, Any] = {"user": user, "resourceAttributes": attrs}
    spec["groups" if version == "v1" else "group"] = groups
    if extra is not None:
        spec["extra"] = extra
    return {
        "apiVersion": f"authorization.k8s.io/{version}",
        "kind": "SubjectAccessReview",
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("version", "user", "groups", "attrs", "extra", "allowed", "denied"),
    [
        (
            "v1",
            "alice",
            [],
            {"namespace": "ns1", "verb": "list", "resource": "configmaps"},
            {"tenant": ["acme"]},
            True,
            False,
        ),
        (
            "v1beta1",
            "carol",
            ["viewers"],
            {"namespace": "ns1", "verb": "get", "resource": "configmaps", "name": "cm0"},
            {"tenant": ["acme"]},
            True,
            False,
        ),
        (
            "v1",
            "carol",
            ["viewers"],
            {"namespace": "ns1", "verb": "get", "resource": "secrets"},
            {"tenant": ["acme"]},
            False,
            False,
        ),
        (
            "v1beta1",
            "alice",
            [],
            {"namespace": "ns1", "verb": "get", "resource": "configmaps", "tenant": "beta"},
            {"tenant": ["acme"]},
            False,
            True,
        ),
        (
            "v1beta1",
            "bob",
            [],
            {"namespace": "ns1", "verb": "get", "resource": "configmaps", "tenant": "beta"},
            {"tenant": ["beta"]},
            True,
            False,
        ),
        (
            "v1",
            "alice",
            [],
            {"namespace": "ns1", "verb": "get", "resource": "configmaps"},
            None,
            False,
            False,
        ),
    ],
)
async def test_subject_access_reviews(
    fronts: Fronts,
    http: aiohttp.ClientSession,
    version: str,
    user: str,
    groups: list[str],
    attrs: dict[str, Any],
    extra: Any,
    allowed: bool,
    denied: bool,
) -> None:
    review = _sar(version, user, groups, {"version": "v1", **attrs}, extra)
    async with http.post(fronts.authz + "/kubernetes", json=review) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert answer["apiVersion"] == f"authorization.k8s.io/{version}"
    assert answer["kind"] == "SubjectAccessReview"
    assert answer["status"]["allowed"] is allowed, answer
    assert answer["status"].get("denied", False) is denied, answer


@pytest.mark.parametrize(
    ("path", "headers", "body"),
    [
        ("/kubernetes", {"Content-Type": "application/json"}, b"{not json"),
        ("/kubernetes", {"Content-Type": "application/json"}, b'{"kind": "SubjectAccessReview"}'),
        (
            "/kubernetes",
            {"Content-Type": "application/json"},
            b'{"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",'
            b' "spec": {"user": "alice", "extra": {"tenant": ["acme"]}}}',
        ),
        ("/nginx", {"Authorization": "Bearer admin"}, None),
        ("/nginx", {"Authorization": "Bearer admin", "X-Original-Method": "GET"}, None),
        ("/envoy", {"Authorization": "Bearer admin"}, None),
        ("/envoyapi/v1/nodes", {"Authorization": "Bearer admin"}, None),
    ],
)
async def test_malformed_questions_are_400_never_allow(
    fronts: Fronts,
    http: aiohttp.ClientSession,
    path: str,
    headers: dict[str, str],
    body: bytes | None,
) -> None:
    method = "POST" if body is not None else "GET"
    async with http.request(method, fronts.authz + path, headers=headers, data=body) as r:
        answer = await r.json(content_type=None)
        assert r.status == 400, answer
    assert answer["kind"] == "Status"
    assert answer["code"] == 400


async def test_malformed_grpc_check_is_denied_400(fronts: Fronts) -> None:
    import grpc

    from sidecar.edge.authz import envoy_grpc as pb

    async with grpc.aio.insecure_channel(f"{fronts.grpc[0]}:{fronts.grpc[1]}") as channel:
        check = channel.unary_unary(pb.METHOD, request_serializer=None, response_deserializer=None)
        for raw in (b"\xff\xff\xff", pb.CheckRequest().SerializeToString()):
            answer = pb.CheckResponse.FromString(await check(raw, timeout=5))
            assert answer.status.code != pb.OK
            assert answer.denied_response.status.code == 400
            assert json.loads(answer.denied_response.body)["code"] == 400


async def test_nginx_denied_without_a_decision_is_a_refusal(
    fronts: Fronts, http: aiohttp.ClientSession
) -> None:
    for decision in (None, "eyJzIjoyMDB9.00000000000000000000000000000000"):
        headers = {"x-decision": decision} if decision else {}
        async with http.get(fronts.authz + "/nginx/denied", headers=headers) as r:
            assert r.status == 403


async def test_a_front_whose_decider_is_down_refuses(
    fronts: Fronts, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    dead = (HOST, free_port())
    upstream = (HOST, fronts.direct_relay.port)
    proxy = (HOST, fronts.sidecar.port)
    before = len(fronts.direct_relay.seen)
    with ProcessGroup() as started:
        envoy = started.add(start_envoy(tmp_path, upstream, dead, proxy, name="envoy-dead"))
        envoy_grpc = started.add(
            start_envoy(tmp_path, upstream, dead, proxy, grpc=dead, name="envoyg-dead")
        )
        nginx = started.add(start_nginx(tmp_path, upstream, dead, proxy, name="nginx-dead"))
        for front in (envoy, envoy_grpc, nginx):
            status, data, _ = await _call(http, front.url, "GET", CM, "alice")
            assert status == 503, (front.name, status, data)
            status, data, _ = await _call(http, front.url, "GET", "/healthz", None)
            assert status == 200, (front.name, status)
    assert len(fronts.direct_relay.seen) == before


async def test_a_refusal_naming_a_long_target_is_still_the_proxys_status(
    fronts: Fronts, http: aiohttp.ClientSession
) -> None:
    target = "/api/v1/tenants/beta/namespaces/ns1/configmaps/" + "a" * 20000
    want, _, _ = await _call(http, fronts.proxy, "GET", target, "alice")
    assert want >= 400
    for name, base in fronts.entrances.items():
        status, data, _ = await _call(http, base, "GET", target, "alice")
        assert status == want, (name, status, data[:200])
        assert json.loads(data)["code"] == want, name

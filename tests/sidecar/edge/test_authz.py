"""The decision service in-process (DESIGN §13): routes, the decision cache and what
invalidates it, the "already decided" marker, the audit line of a cached decision, and
the listener's HTTP server (pipelining, garbage, oversize heads)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from multidict import CIMultiDict

from sidecar.app import build_app
from sidecar.config.settings import load_config
from sidecar.edge.authz.app import AUTHZ_KEY
from sidecar.edge.authz.decider import DIRECT, PROXY, Decided, Decider, described_request
from sidecar.edge.authz.fastserver import FastServer, Question
from sidecar.edge.authz.marker import HEADER, Marker
from sidecar.pipeline.audit import line_for
from sidecar.pipeline.context import RequestContext
from tests.rigs.inprocess import TEST_POLICY
from tests.rigs.waiting import eventually

TOKENS = [
    {"token": "alice", "user": "alice", "tenant": "acme", "groups": ["users"]},
    {"token": "bob", "user": "bob", "tenant": "beta", "groups": ["users"]},
    {"token": "comma", "user": "carl", "tenant": "acme", "groups": ["users", "a,b"]},
]
CM = "/api/v1/tenants/acme/namespaces/dev/configmaps"


@dataclass
class Rig:
    decider: Decider
    handler: Any
    tokens: Path
    audit: Path

    async def decide(
        self, method: str, target: str, token: str | None = "alice", **headers: str
    ) -> Decided:
        sent = [(k.replace("_", "-"), v) for k, v in headers.items()]
        if token:
            sent.append(("Authorization", f"Bearer {token}"))
        return await self.decider.decide(method, target, sent, "10.0.0.1")


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "test.yaml").write_text(TEST_POLICY)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKENS))
    config = load_config(
        None,
        env={},
        overrides={
            "upstream": "http://127.0.0.1:9",
            "policies": str(policies),
            "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
            "audit.path": str(tmp_path / "audit.log"),
            "reload.enabled": False,
            "identity.tokenFile": str(tokens),
            "authz.listen": "127.0.0.1:1",
        },
    )
    app = build_app(config)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        authz = app[AUTHZ_KEY]
        yield Rig(authz.decider, authz.handler, tokens, tmp_path / "audit.log")
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("method", "target", "token", "headers", "route"),
    [
        ("GET", CM, "alice", {}, DIRECT),
        ("HEAD", CM + "/cm0", "alice", {}, DIRECT),
        ("GET", CM + "?labelSelector=a%3Db", "alice", {}, DIRECT),
        ("GET", "/api/v1/namespaces/dev/configmaps", "alice", {}, PROXY),  # short path
        ("GET", "/api/v1/%74enants/acme/namespaces/dev/configmaps", "alice", {}, PROXY),
        ("GET", CM + "?watch=true", "alice", {}, PROXY),
        ("GET", "/api/v1/watch/tenants/acme/namespaces/dev/configmaps", "alice", {}, PROXY),
        ("POST", CM, "alice", {}, PROXY),
        ("DELETE", CM + "/cm0", "alice", {}, PROXY),
        ("PATCH", CM + "/cm0", "alice", {}, PROXY),
        ("GET", "/healthz", None, {}, PROXY),
        ("GET", "/quota/v1/tenants/acme", "alice", {}, PROXY),
        ("GET", CM, "alice", {"X-Remote-User": "root"}, PROXY),
        ("GET", CM, "alice", {"x_remote_user": "root"}, PROXY),
        ("GET", CM, "alice", {"Impersonate-User": "alice", "Impersonate-Group": "users"}, PROXY),
        ("GET", CM, "alice", {"x-sidecar-route": "direct"}, PROXY),
        ("GET", CM, "comma", {}, PROXY),  # a group nginx could not carry
    ],
)
async def test_routes(
    rig: Rig, method: str, target: str, token: str | None, headers: dict[str, str], route: str
) -> None:
    sent = list(headers.items())
    if token:
        sent.append(("Authorization", f"Bearer {token}"))
    decided = await rig.decider.decide(method, target, sent, "10.0.0.1")
    assert decided.allowed is not None, decided.refusal and decided.refusal.body
    assert decided.allowed.route == route
    names = [k for k, _ in decided.allowed.headers]
    if route == DIRECT:
        assert ("x-remote-user", "alice") in decided.allowed.headers
        assert ("x-remote-group", "users") in decided.allowed.headers
        assert HEADER not in names
    else:
        assert "x-remote-user" not in names
        assert HEADER in names or target == "/healthz"


async def test_refusals_are_the_proxys(rig: Rig) -> None:
    for token, target, status in [
        (None, CM, 401),
        ("nope", CM, 401),
        ("alice", "/api/v1/tenants/beta/namespaces/dev/configmaps", 404),
        ("alice", "/api/v1/tenants/ghost/namespaces/dev/configmaps", 404),
        ("alice", CM + "?watch=1&watch=1", 400),
    ]:
        decided = await rig.decide("GET", target, token)
        assert decided.refusal is not None, (token, target)
        assert decided.refusal.status == status
        body = json.loads(decided.refusal.body)  # type: ignore[arg-type]
        assert body["kind"] == "Status"
    beta = await rig.decide("GET", "/api/v1/tenants/beta/namespaces/dev/configmaps")
    ghost = await rig.decide("GET", "/api/v1/tenants/ghost/namespaces/dev/configmaps")
    assert beta.refusal is not None
    assert ghost.refusal is not None
    assert json.loads(beta.refusal.body)["message"].replace("beta", "T") == json.loads(  # type: ignore[arg-type]
        ghost.refusal.body  # type: ignore[arg-type]
    )["message"].replace("ghost", "T")


async def test_cached_allow_is_forgotten_with_its_credential(rig: Rig) -> None:
    first = await rig.decide("GET", CM)
    again = await rig.decide("GET", CM)
    assert first.allowed is not None
    assert again is first  # answered from the cache
    before = rig.decider.identity.authenticators
    rig.tokens.write_text(yaml.safe_dump(TOKENS[1:]))  # alice's token removed
    rig.decider.credentials.request()
    await eventually(
        lambda: rig.decider.identity.authenticators is not before, what="credentials reloaded"
    )
    gone = await rig.decide("GET", CM)
    assert gone.refusal is not None
    assert gone.refusal.status == 401


async def test_cached_allow_is_forgotten_with_its_policy(rig: Rig) -> None:
    first = await rig.decide("GET", CM)
    assert first is not None
    entry = next(iter(rig.decider._cache.values()))
    assert rig.decider._valid(entry)
    entry.policy = object()  # another policy snapshot is in force
    assert not rig.decider._valid(entry)
    second = await rig.decide("GET", CM)
    assert second is not first


async def test_cached_decisions_are_audited_like_the_others(rig: Rig) -> None:
    await rig.decide("GET", CM)
    entry = next(iter(rig.decider._cache.values()))
    request = described_request("GET", CM, CIMultiDict(), "10.0.0.1")
    ctx = RequestContext(request=request, request_id="r1", policy=entry.policy, max_body_bytes=1)  # type: ignore[arg-type]
    ctx.identity, ctx.target, ctx.decision = entry.identity, entry.target, entry.verdict
    ctx.audit.update(
        {
            "authenticator": entry.identity.authenticator,
            "authz": entry.audit_authz,
            "decider": DIRECT,
        }
    )
    ctx.audit["ratelimit"] = "allowed"

    def without_latency(line: str) -> str:
        return re.sub(r'"latencyMs":[0-9.e-]+', "", line)

    assert without_latency(entry.audit_line.line(ctx, 200)) == without_latency(line_for(ctx, 200))


def test_marker_binds_the_request_and_expires() -> None:
    marker = Marker(30, key=b"k" * 32)
    value = marker.sign("GET", "/a", "Bearer x")
    assert marker.verify(value, "GET", "/a", "Bearer x")
    assert not marker.verify(value, "GET", "/b", "Bearer x")
    assert not marker.verify(value, "POST", "/a", "Bearer x")
    assert not marker.verify(value, "GET", "/a", "Bearer y")
    assert not Marker(30, key=b"o" * 32).verify(value, "GET", "/a", "Bearer x")
    expired = "1." + value.partition(".")[2]
    assert not marker.verify(expired, "GET", "/a", "Bearer x")
    assert not marker.verify("9999999999." + "0" * 64, "GET", "/a", "Bearer x")
    assert marker.unseal(marker.seal(b"payload")) == b"payload"
    assert marker.unseal(marker.seal(b"payload")[:-1] + "0") is None


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(1 << 20), 5)
    finally:
        writer.close()


async def test_listener_answers_pipelined_questions_in_order(rig: Rig) -> None:
    server = FastServer(rig.handler, "127.0.0.1", 0, False)
    await server.start()
    assert server.server is not None
    port = server.server.sockets[0].getsockname()[1]
    try:
        ask = (
            b"GET /envoy"
            + CM.encode()
            + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice\r\n\r\n"
            b"GET /envoy" + CM.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answer = await _exchange(port, ask)
        statuses = re.findall(rb"HTTP/1.1 (\d+)", answer)
        assert statuses == [b"200", b"401", b"200"]
        for garbage in (
            b"NOT HTTP\r\n\r\n",
            b"GET / HTTP/1.1\r\n" + b"X: " + b"y" * 70000 + b"\r\n\r\n",
        ):
            answer = await _exchange(port, garbage)
            assert answer.startswith(b"HTTP/1.1 400"), answer[:60]
    finally:
        await server.cleanup()


async def test_listener_malformed_questions(rig: Rig) -> None:
    for question in (
        Question("GET", "/nginx", [("Authorization", "Bearer alice")], b"", "1.2.3.4"),
        Question("GET", "/nginx", [("X-Original-Method", "get"), ("X-Original-URI", CM)], b"", ""),
        Question("GET", "/envoyx", [], b"", ""),
        Question("GET", "/envoy//evil", [], b"", ""),
        Question("POST", "/kubernetes", [("Content-Type", "application/json")], b"[]", ""),
    ):
        answer = await rig.handler(question)
        assert answer.startswith(b"HTTP/1.1 400"), (question, answer[:80])


async def test_cached_allow_keeps_the_tenants_mode(tmp_path: Path) -> None:
    """A tenant in dry-run: its cached reads over the rate limit are counted, not
    refused, as the first (uncached) one was decided."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "test.yaml").write_text(
        TEST_POLICY
        + "---\nkind: TenantMode\nmetadata: {name: acme}\nspec: {tenant: acme, mode: dry-run}\n"
        + "---\nkind: RateLimit\nmetadata: {name: acme}\nspec: {tenant: acme, rate: 0.001, burst: 1}\n"
    )
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKENS))
    config = load_config(
        None,
        env={},
        overrides={
            "upstream": "http://127.0.0.1:9",
            "policies": str(policies),
            "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
            "audit.path": str(tmp_path / "audit.log"),
            "reload.enabled": False,
            "identity.tokenFile": str(tokens),
            "authz.listen": "127.0.0.1:1",
        },
    )
    app = build_app(config)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        decider = app[AUTHZ_KEY].decider
        sent = [("Authorization", "Bearer alice")]
        answers = [await decider.decide("GET", CM, sent, "10.0.0.1") for _ in range(4)]
        assert all(a.allowed is not None for a in answers), answers
        assert len(decider._cache) == 1
    finally:
        await runner.cleanup()

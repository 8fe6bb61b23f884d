"""Each authenticator end to end: client → real sidecar app → recording upstream.

Asserts the identity headers the upstream received, that spoofed `X-Remote-*`
headers never get through, and that every bad credential is a 401 Status body that
never reaches the upstream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from jwt.algorithms import ECAlgorithm

from tests.rigs.inprocess import RecordingUpstream, recording_upstream, running_sidecar, status_body
from tests.rigs.processes import write_tokens
from tests.rigs.tokens import (
    AUDIENCE,
    ISSUER,
    SECRET,
    claims,
    ec_key,
    forge_hs256,
    hs256,
    public_pem,
    rsa_key,
    unsigned,
)

RSA = rsa_key()
EC = ec_key()
PODS = "/api/v1/tenants/acme/namespaces/dev/pods"


@dataclass
class Env:
    url: str
    upstream: RecordingUpstream
    http: aiohttp.ClientSession

    async def call(
        self, path: str = PODS, headers: Any = None, method: str = "GET"
    ) -> tuple[int, bytes]:
        async with self.http.request(method, self.url + path, headers=headers) as resp:
            return resp.status, await resp.read()


def key_files(tmp: Path) -> dict[str, Any]:
    pem = tmp / "rsa.pem"
    pem.write_bytes(public_pem(RSA))
    jwk = json.loads(ECAlgorithm.to_jwk(EC.public_key()))
    jwk["kid"] = "ec-1"
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk]}))
    tokens = write_tokens(
        tmp,
        [
            {"token": "static-alice", "user": "alice", "tenant": "acme", "groups": ["users"]},
            {"token": "static-bob", "user": "bob", "tenant": "beta", "groups": ["users", "qa"]},
        ],
    )
    return {
        "identity.jwt.algorithms": ["HS256", "RS256", "ES256"],
        "identity.jwt.secret": SECRET,
        "identity.jwt.publicKeyFile": str(pem),
        "identity.jwt.jwksFile": str(jwks),
        "identity.jwt.issuer": ISSUER,
        "identity.jwt.audience": AUDIENCE,
        "identity.tokenFile": str(tokens),
    }


@asynccontextmanager
async def environment(tmp: Path, **overrides: Any) -> AsyncIterator[Env]:
    config = {**key_files(tmp), **overrides}
    async with recording_upstream() as upstream:
        async with running_sidecar(tmp, upstream.url, config) as url:
            async with aiohttp.ClientSession() as http:
                yield Env(url, upstream, http)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with environment(tmp_path) as e:
        yield e


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def forwarded_as(env: Env, headers: Any, path: str = PODS) -> Any:
    before = len(env.upstream.forwarded)
    status, body = await env.call(path, headers)
    assert status == 200, body
    assert len(env.upstream.forwarded) == before + 1
    return env.upstream.forwarded[-1]


# -- each authenticator -------------------------------------------------------------


async def test_hs256_jwt_sets_identity_headers(env: Env) -> None:
    token = hs256(claims("alice", "acme", ["users", "devs"]))
    seen = await forwarded_as(env, bearer(token))
    assert seen.one("X-Remote-User") == "alice"
    assert seen.one("X-Remote-Tenant") == "acme"
    assert seen.all("X-Remote-Group") == ["users", "devs"]
    assert seen.one("Authorization") == f"Bearer {token}"
    assert seen.path == PODS


async def test_rs256_pem_jwt(env: Env) -> None:
    token = jwt.encode(claims("bob", "acme", ["users", "qa"]), RSA, algorithm="RS256")
    seen = await forwarded_as(env, bearer(token))
    assert (seen.one("X-Remote-User"), seen.one("X-Remote-Tenant")) == ("bob", "acme")
    assert seen.all("X-Remote-Group") == ["users", "qa"]


async def test_es256_jwks_jwt(env: Env) -> None:
    token = jwt.encode(
        claims("carol", "acme", "users"), EC, algorithm="ES256", headers={"kid": "ec-1"}
    )
    seen = await forwarded_as(env, bearer(token))
    assert (seen.one("X-Remote-User"), seen.one("X-Remote-Tenant")) == ("carol", "acme")
    assert seen.all("X-Remote-Group") == ["users"]  # a single-string groups claim


async def test_static_token(env: Env) -> None:
    seen = await forwarded_as(env, bearer("static-alice"))
    assert (seen.one("X-Remote-User"), seen.one("X-Remote-Tenant")) == ("alice", "acme")
    assert seen.all("X-Remote-Group") == ["users"]


async def test_trusted_headers_from_trusted_client(tmp_path: Path) -> None:
    async with environment(
        tmp_path,
        **{
            "identity.trustedHeaders.enabled": True,
            "identity.trustedHeaders.clients": ["127.0.0.0/8"],
        },
    ) as env:
        headers = [
            ("X-Remote-User", "gina"),
            ("X-Remote-Tenant", "acme"),
            ("X-Remote-Group", "users"),
            ("X-Remote-Group", "ops"),
        ]
        seen = await forwarded_as(env, headers)
        assert (seen.one("X-Remote-User"), seen.one("X-Remote-Tenant")) == ("gina", "acme")
        assert seen.all("X-Remote-Group") == ["users", "ops"]


async def test_trusted_headers_from_untrusted_client_are_stripped(tmp_path: Path) -> None:
    async with environment(
        tmp_path,
        **{
            "identity.trustedHeaders.enabled": True,
            "identity.trustedHeaders.clients": ["10.0.0.0/8"],
        },
    ) as env:
        spoof = [
            ("X-Remote-User", "root"),
            ("X-Remote-Tenant", "system"),
            ("X-Remote-Group", "operators"),
            ("X-Remote-Extra-Scopes", "all"),
        ]
        # No real credential: judged as anonymous, and nothing is forwarded.
        status, body = await env.call(PODS, spoof)
        assert status == 401
        assert status_body(body)["reason"] == "Unauthorized"
        assert env.upstream.forwarded == []
        # With a real credential: judged by it, the spoofed values never arrive.
        seen = await forwarded_as(
            env,
            [*spoof, *bearer("static-bob").items()],
            path="/api/v1/tenants/beta/namespaces/dev/pods",
        )
        assert (seen.one("X-Remote-User"), seen.one("X-Remote-Tenant")) == ("bob", "beta")
        assert seen.all("X-Remote-Group") == ["users", "qa"]
        assert seen.all("X-Remote-Extra-Scopes") == []


async def test_spoofed_headers_with_trusted_headers_disabled(env: Env) -> None:
    spoof = {
        "X-Remote-User": "root",
        "X-Remote-Tenant": "system",
        "X-Remote-Group": "operators",
        **bearer("static-alice"),
    }
    seen = await forwarded_as(env, spoof, path="/api/v1/namespaces/dev/pods")
    assert (seen.one("X-Remote-User"), seen.one("X-Remote-Tenant")) == ("alice", "acme")
    assert seen.all("X-Remote-Group") == ["users"]


async def test_forward_authorization_false(tmp_path: Path) -> None:
    async with environment(tmp_path, **{"identity.forwardAuthorization": False}) as env:
        seen = await forwarded_as(env, bearer("static-alice"))
        assert seen.all("Authorization") == []
        assert seen.one("X-Remote-User") == "alice"


async def test_health_endpoints_need_no_credentials(env: Env) -> None:
    for path in ("/healthz", "/readyz"):
        status, _ = await env.call(path)
        assert status == 200, path
    # /metrics names tenants: authorized like any non-resource URL (DESIGN §9).
    status, _ = await env.call("/metrics")
    assert status == 401
    assert env.upstream.forwarded == []


# -- bad credentials: 401, never forwarded ------------------------------------------


def _bad_tokens() -> dict[str, Any]:
    wrong_rsa = rsa_key()
    no_tenant = claims()
    no_tenant.pop("tenant")
    return {
        "expired": bearer(hs256(claims(lifetime=-30))),
        "not yet valid": bearer(hs256(claims(nbf=claims()["iat"] + 3600))),
        "wrong HS key": bearer(hs256(claims(), "a-different-secret-with-enough-length-42")),
        "wrong RSA key": bearer(jwt.encode(claims(), wrong_rsa, algorithm="RS256")),
        "alg none": bearer(unsigned(claims())),
        "HS256 signed with the RSA public key": bearer(forge_hs256(claims(), public_pem(RSA))),
        "wrong issuer": bearer(hs256(claims(iss="https://evil.test"))),
        "wrong audience": bearer(hs256(claims(aud="another-service"))),
        "missing tenant claim": bearer(hs256(no_tenant)),
        "non-DNS tenant claim": bearer(hs256(claims(tenant="Acme_Corp"))),
        "tenant claim with a slash": bearer(hs256(claims(tenant="acme/../beta"))),
        "unknown static token": bearer("static-mallory"),
        "garbage": {"Authorization": "!!garbage!!"},
        "basic auth": {"Authorization": "Basic YWxpY2U6cw=="},
        "empty bearer": {"Authorization": "Bearer "},
        "no credentials": {},
    }


BAD = _bad_tokens()


@pytest.mark.parametrize("case", sorted(BAD))
async def test_bad_credentials_are_401_and_never_forwarded(env: Env, case: str) -> None:
    for method in ("GET", "POST", "DELETE"):
        status, body = await env.call(PODS, BAD[case], method=method)
        assert status == 401, (case, body)
        status_obj = status_body(body)
        assert status_obj["code"] == 401
        assert status_obj["reason"] == "Unauthorized"
        assert status_obj["message"]
    assert env.upstream.forwarded == []


async def test_non_ascii_user_name_is_forwarded_intact(env: Env) -> None:
    token = hs256(claims("josé", "acme", ["users", "équipe"]))
    seen = await forwarded_as(env, bearer(token))
    assert seen.one("X-Remote-User") == "josé"
    assert seen.all("X-Remote-Group") == ["users", "équipe"]

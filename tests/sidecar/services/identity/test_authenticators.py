"""Unit tests of the authenticators and the identity stage (no network)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_
from jwt.algorithms import RSAAlgorithm

from sidecar.config.settings import ConfigError, load_config
from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.pipeline.identity import IdentityStage
from sidecar.services.identity.authenticators import build_authenticators
from sidecar.services.identity.jwt import JwtAuthenticator
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


def stage(**overrides: Any) -> IdentityStage:
    config = load_config(None, env={}, overrides=overrides)
    return IdentityStage(build_authenticators(config.identity), config.mode)


def hs_stage(**extra: Any) -> IdentityStage:
    return stage(
        **{
            "identity.jwt.secret": SECRET,
            "identity.jwt.issuer": ISSUER,
            "identity.jwt.audience": AUDIENCE,
            **extra,
        }
    )


def request(
    headers: dict[str, str] | list[tuple[str, str]] | None = None, remote: str = "127.0.0.1"
) -> web.Request:
    from multidict import CIMultiDict

    h: CIMultiDict[str] = CIMultiDict(headers or {})
    return make_mocked_request("GET", "/api/v1/namespaces/dev/pods", headers=h).clone(remote=remote)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rejected(st: IdentityStage, req: web.Request) -> str:
    with pytest.raises(StatusError) as info:
        st.authenticate(req)
    assert info.value.code == 401
    assert info.value.reason == "Unauthorized"
    assert "WWW-Authenticate" in info.value.headers
    return info.value.message


# -- JWT: good tokens ------------------------------------------------------------------


def test_hs256_token_gives_identity() -> None:
    token = hs256(claims("alice", "acme", ["users", "devs"]))
    got = hs_stage().authenticate(request(bearer(token)))
    assert got == Identity("alice", "acme", ("users", "devs"), "jwt")


def test_rs256_pem_public_key(tmp_path: Path) -> None:
    pem = tmp_path / "key.pem"
    pem.write_bytes(public_pem(RSA))
    st = stage(**{"identity.jwt.algorithms": ["RS256"], "identity.jwt.publicKeyFile": str(pem)})
    token = jwt.encode(claims("bob", "beta", aud=None), RSA, algorithm="RS256")
    assert st.authenticate(request(bearer(token))) == Identity("bob", "beta", ("users",), "jwt")


def test_es256_pem_public_key(tmp_path: Path) -> None:
    pem = tmp_path / "key.pem"
    pem.write_bytes(public_pem(EC))
    st = stage(**{"identity.jwt.algorithms": ["ES256"], "identity.jwt.publicKeyFile": str(pem)})
    token = jwt.encode(claims("carol", "acme", aud=None), EC, algorithm="ES256")
    assert st.authenticate(request(bearer(token))).user == "carol"


def jwks_file(tmp: Path, *keys: tuple[Any, str]) -> Path:
    entries = []
    for key, kid in keys:
        jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
        jwk["kid"] = kid
        entries.append(jwk)
    path = tmp / "jwks.json"
    path.write_text(json.dumps({"keys": entries}))
    return path


def test_jwks_file_picks_key_by_kid(tmp_path: Path) -> None:
    other = rsa_key()
    path = jwks_file(tmp_path, (other, "k1"), (RSA, "k2"))
    st = stage(**{"identity.jwt.algorithms": ["RS256"], "identity.jwt.jwksFile": str(path)})
    token = jwt.encode(
        claims("dan", "acme", aud=None), RSA, algorithm="RS256", headers={"kid": "k2"}
    )
    assert st.authenticate(request(bearer(token))).user == "dan"
    # No kid: every key of the family is tried.
    token = jwt.encode(claims("dan", "acme", aud=None), other, algorithm="RS256")
    assert st.authenticate(request(bearer(token))).user == "dan"
    # A key not in the set does not verify.
    token = jwt.encode(
        claims("eve", "acme", aud=None), rsa_key(), algorithm="RS256", headers={"kid": "k2"}
    )
    assert "signature" in rejected(st, request(bearer(token)))


def test_configurable_claim_names() -> None:
    st = stage(
        **{
            "identity.jwt.secret": SECRET,
            "identity.jwt.claims.user": "preferred_username",
            "identity.jwt.claims.tenant": "org.tenant",
            "identity.jwt.claims.groups": "roles",
        }
    )
    token = hs256(
        {
            "preferred_username": "frank",
            "org": {"tenant": "acme"},
            "roles": ["ops"],
            "exp": int(time.time()) + 60,
        }
    )
    assert st.authenticate(request(bearer(token))) == Identity("frank", "acme", ("ops",), "jwt")


# -- JWT: every bad token -------------------------------------------------------------


def test_expired_token() -> None:
    token = hs256(claims(lifetime=-10))
    assert "expired" in rejected(hs_stage(), request(bearer(token)))


def test_not_yet_valid_token() -> None:
    token = hs256(claims(nbf=int(time.time()) + 3600))
    assert "not valid yet" in rejected(hs_stage(), request(bearer(token)))


def test_wrong_secret() -> None:
    token = hs256(claims(), secret="another-secret-of-sufficient-length-0123456789")
    assert "signature" in rejected(hs_stage(), request(bearer(token)))


def test_wrong_rsa_key(tmp_path: Path) -> None:
    pem = tmp_path / "key.pem"
    pem.write_bytes(public_pem(RSA))
    st = stage(**{"identity.jwt.algorithms": ["RS256"], "identity.jwt.publicKeyFile": str(pem)})
    token = jwt.encode(claims(aud=None), rsa_key(), algorithm="RS256")
    assert "signature" in rejected(st, request(bearer(token)))


def test_alg_none_rejected() -> None:
    token = unsigned(claims())
    assert "alg none" in rejected(hs_stage(), request(bearer(token)))


def test_alg_none_rejected_even_when_configured_with_capitalised_none() -> None:
    header = base64.urlsafe_b64encode(b'{"alg":"None","typ":"JWT"}').rstrip(b"=").decode()
    body = base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=").decode()
    assert "alg none" in rejected(hs_stage(), request(bearer(f"{header}.{body}.")))


def test_algorithm_confusion_hs256_with_rsa_public_key(tmp_path: Path) -> None:
    pem_bytes = public_pem(RSA)
    pem = tmp_path / "key.pem"
    pem.write_bytes(pem_bytes)
    # Even with HS256 also allowed in the list, the RSA key never verifies an HS token.
    st = stage(
        **{"identity.jwt.algorithms": ["RS256", "HS256"], "identity.jwt.publicKeyFile": str(pem)}
    )
    token = forge_hs256(claims(aud=None), pem_bytes)
    assert "no verification key" in rejected(st, request(bearer(token)))
    st = stage(**{"identity.jwt.algorithms": ["RS256"], "identity.jwt.publicKeyFile": str(pem)})
    assert "not accepted" in rejected(st, request(bearer(token)))


def test_wrong_issuer_and_audience() -> None:
    st = hs_stage()
    assert "issuer" in rejected(st, request(bearer(hs256(claims(iss="https://evil.test")))))
    assert "audience" in rejected(st, request(bearer(hs256(claims(aud="someone-else")))))
    no_iss = claims()
    del no_iss["iss"]
    assert "'iss'" in rejected(st, request(bearer(hs256(no_iss))))


def test_missing_tenant_claim() -> None:
    token = hs256(claims(tenant=None))
    assert "tenant" in rejected(hs_stage(), request(bearer(token)))


@pytest.mark.parametrize("tenant", ["Acme", "acme_corp", "-acme", "a" * 64, "", "ac me", 7])
def test_non_dns_tenant_claim(tenant: object) -> None:
    token = hs256(claims(tenant=tenant))  # type: ignore[arg-type]
    message = rejected(hs_stage(), request(bearer(token)))
    assert "tenant" in message


def test_user_and_group_names_that_cannot_be_header_values() -> None:
    injected = hs256(claims("alice\r\nX-Remote-Tenant: system"))
    assert "user name" in rejected(hs_stage(), request(bearer(injected)))
    group = hs256(claims(groups=["ops\nX-Remote-User: root"]))
    assert "group name" in rejected(hs_stage(), request(bearer(group)))
    assert "user name" in rejected(hs_stage(), request(bearer(hs256(claims("u" * 300)))))


def test_missing_user_and_bad_groups() -> None:
    no_sub = claims()
    del no_sub["sub"]
    assert "'sub'" in rejected(hs_stage(), request(bearer(hs256(no_sub))))
    bad_groups = claims(groups=None)
    bad_groups["groups"] = [1, 2]
    assert "groups" in rejected(hs_stage(), request(bearer(hs256(bad_groups))))


@pytest.mark.parametrize(
    "value",
    [
        "Bearer",
        "Bearer ",
        "Bearer a b",
        "Basic YWxpY2U6cGFzcw==",
        "bearer \x01\x02",
        "Bearer " + "x" * 20000,
        "Token abc",
        "garbage",
        "Bearer not.a.jwt",
        "Bearer eyJhbGciOiJIUzI1NiJ9.%%%.sig",
    ],
)
def test_garbage_authorization(value: str) -> None:
    rejected(hs_stage(), request({"Authorization": value}))


def test_two_authorization_headers() -> None:
    token = hs256(claims())
    headers = [("Authorization", f"Bearer {token}"), ("Authorization", f"Bearer {token}")]
    assert "more than one" in rejected(hs_stage(), request(headers))


def test_no_credentials() -> None:
    assert "no credentials" in rejected(hs_stage(), request())


def test_no_authenticator_configured_rejects_everything() -> None:
    assert "no credentials" in rejected(stage(), request())


# -- JWT cache ----------------------------------------------------------------------


def test_cache_serves_hot_token_and_never_past_exp(monkeypatch: pytest.MonkeyPatch) -> None:
    st = hs_stage()
    auth = st.authenticators[0]
    assert isinstance(auth, JwtAuthenticator)
    calls = 0
    real = auth.verify

    def counting(token: str, header: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(token, header)

    monkeypatch.setattr(auth, "verify", counting)
    token = hs256(claims(lifetime=30))
    for _ in range(5):
        assert st.authenticate(request(bearer(token))).user == "alice"
    assert calls == 1
    ((_identity, expires),) = auth.cache.values()
    assert expires == jwt.decode(token, options={"verify_signature": False})["exp"]
    # Once the clock passes the token's exp, the cached entry is not used any more:
    # the token is verified again (and PyJWT's own clock then judges it).
    later = expires + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert len(auth.cache) == 0
    st.authenticate(request(bearer(token)))
    assert calls == 2


def test_cache_is_bounded() -> None:
    st = hs_stage(**{"identity.jwt.cacheSize": 3})
    auth = st.authenticators[0]
    assert isinstance(auth, JwtAuthenticator)
    for i in range(10):
        st.authenticate(request(bearer(hs256(claims(f"user{i}")))))
    assert len(auth.cache) == 3


def test_failed_tokens_are_not_cached() -> None:
    st = hs_stage()
    auth = st.authenticators[0]
    assert isinstance(auth, JwtAuthenticator)
    rejected(st, request(bearer(hs256(claims(lifetime=-5)))))
    assert len(auth.cache) == 0


# -- JWT configuration errors ---------------------------------------------------------


def test_config_rejects_none_algorithm() -> None:
    with pytest.raises(ConfigError, match="none"):
        stage(**{"identity.jwt.secret": SECRET, "identity.jwt.algorithms": ["none"]})


def test_config_rejects_key_without_matching_algorithm(tmp_path: Path) -> None:
    pem = tmp_path / "key.pem"
    pem.write_bytes(public_pem(RSA))
    with pytest.raises(ConfigError, match="no algorithm for the key"):
        stage(**{"identity.jwt.publicKeyFile": str(pem)})  # algorithms default [HS256]
    with pytest.raises(ConfigError, match="no HS"):
        stage(**{"identity.jwt.secret": SECRET, "identity.jwt.algorithms": ["RS256"]})
    with pytest.raises(ConfigError, match="PEM"):
        stage(**{"identity.jwt.secret": public_pem(RSA).decode()})


def test_config_rejects_unreadable_key_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="publicKeyFile"):
        stage(
            **{
                "identity.jwt.algorithms": ["RS256"],
                "identity.jwt.publicKeyFile": str(tmp_path / "missing.pem"),
            }
        )
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(ConfigError, match="no PEM public key"):
        stage(**{"identity.jwt.algorithms": ["RS256"], "identity.jwt.publicKeyFile": str(bad)})
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    with pytest.raises(ConfigError, match="keys"):
        stage(**{"identity.jwt.algorithms": ["RS256"], "identity.jwt.jwksFile": str(jwks)})


# -- static tokens ------------------------------------------------------------------


def static_stage(tmp: Path, **extra: Any) -> IdentityStage:
    path = write_tokens(
        tmp,
        [
            {"token": "acme-alice-token", "user": "alice", "tenant": "acme", "groups": ["users"]},
            {"token": "ops-token", "user": "root", "tenant": "system"},
        ],
    )
    return stage(**{"identity.tokenFile": str(path), **extra})


def test_static_token(tmp_path: Path) -> None:
    st = static_stage(tmp_path)
    assert st.authenticate(request(bearer("acme-alice-token"))) == Identity(
        "alice", "acme", ("users",), "static-token"
    )
    ops = st.authenticate(request(bearer("ops-token")))
    assert ops.is_operator
    assert ops.groups == ()


def test_unknown_static_token(tmp_path: Path) -> None:
    assert "not valid" in rejected(static_stage(tmp_path), request(bearer("nope")))


def test_jwt_then_static_token_order(tmp_path: Path) -> None:
    st = static_stage(tmp_path, **{"identity.jwt.secret": SECRET})
    assert st.authenticate(request(bearer("acme-alice-token"))).authenticator == "static-token"
    jwt_identity = st.authenticate(request(bearer(hs256(claims("bob", "beta", aud=None)))))
    assert jwt_identity.authenticator == "jwt"
    assert "signature" in rejected(st, request(bearer(hs256(claims(aud=None), "x" * 40))))


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"token": "t", "user": "u", "tenant": "Bad_Tenant"}], "DNS-1123"),
        ([{"token": "t", "user": "", "tenant": "acme"}], "user"),
        ([{"token": "has space", "user": "u", "tenant": "acme"}], "token"),
        ([{"token": "t", "user": "u", "tenant": "acme", "groups": "g"}], "groups"),
        ([{"token": "t", "user": "u", "tenant": "acme", "role": "x"}], "unknown keys"),
        (
            [
                {"token": "t", "user": "u", "tenant": "a"},
                {"token": "t", "user": "v", "tenant": "b"},
            ],
            "twice",
        ),
        ({"token": "t"}, "list"),
    ],
)
def test_bad_token_file(tmp_path: Path, entries: Any, message: str) -> None:
    path = tmp_path / "tokens.yaml"
    import yaml

    path.write_text(yaml.safe_dump(entries))
    with pytest.raises(ConfigError, match=message):
        stage(**{"identity.tokenFile": str(path)})


def test_missing_token_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        stage(**{"identity.tokenFile": str(tmp_path / "nope.yaml")})


# -- trusted headers -------------------------------------------------------------------

REMOTE = {"X-Remote-User": "gina", "X-Remote-Tenant": "acme"}


def trusted_stage(clients: list[str], **extra: Any) -> IdentityStage:
    return stage(
        **{
            "identity.trustedHeaders.enabled": True,
            "identity.trustedHeaders.clients": clients,
            **extra,
        }
    )


def test_trusted_headers_from_trusted_address() -> None:
    st = trusted_stage(["10.0.0.0/8", "127.0.0.1"])
    headers = [*REMOTE.items(), ("X-Remote-Group", "users"), ("X-Remote-Group", "ops")]
    got = st.authenticate(request(headers, remote="10.20.30.40"))
    assert got == Identity("gina", "acme", ("users", "ops"), "trusted-headers")
    assert st.authenticate(request(REMOTE, remote="127.0.0.1")).user == "gina"
    assert st.authenticate(request(REMOTE, remote="::ffff:127.0.0.1")).user == "gina"


def test_trusted_headers_from_untrusted_address_are_ignored() -> None:
    st = trusted_stage(["10.0.0.0/8"])
    assert "no credentials" in rejected(st, request(REMOTE, remote="192.168.1.5"))
    # With a real credential the spoofed headers change nothing.
    st = trusted_stage(["10.0.0.0/8"], **{"identity.jwt.secret": SECRET})
    token = hs256(claims("alice", "acme", aud=None))
    spoofed = {**bearer(token), "X-Remote-User": "root", "X-Remote-Tenant": "system"}
    assert st.authenticate(request(spoofed, remote="192.168.1.5")) == Identity(
        "alice", "acme", ("users",), "jwt"
    )


def test_trusted_headers_disabled_by_default() -> None:
    assert "no credentials" in rejected(stage(), request(REMOTE, remote="127.0.0.1"))


def test_trusted_headers_bad_values() -> None:
    st = trusted_stage(["127.0.0.1"])
    assert "X-Remote-Tenant" in rejected(st, request({"X-Remote-User": "gina"}))
    bad = {"X-Remote-User": "gina", "X-Remote-Tenant": "NOT_DNS"}
    assert "DNS-1123" in rejected(st, request(bad))
    two = [("X-Remote-User", "a"), ("X-Remote-User", "b"), ("X-Remote-Tenant", "acme")]
    assert "exactly one" in rejected(st, request(two))


def test_trusted_clients_must_be_addresses() -> None:
    with pytest.raises(ConfigError, match="clients"):
        trusted_stage(["not-an-ip"])


# -- properties: whatever a client sends, the answer is an identity or a 401 ------------

_STAGE = hs_stage()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


_json = st_.recursive(
    st_.none() | st_.booleans() | st_.integers() | st_.floats(allow_nan=False) | st_.text(),
    lambda inner: st_.lists(inner, max_size=3) | st_.dictionaries(st_.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(value=st_.text(max_size=200))
def test_any_authorization_value_is_401(value: str) -> None:
    try:
        req = request({"Authorization": value})
    except ValueError:
        return  # not representable as an HTTP header
    rejected(_STAGE, req)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(header=_json, payload=_json, signature=st_.binary(max_size=40))
def test_any_forged_jwt_is_401(header: Any, payload: Any, signature: bytes) -> None:
    token = ".".join(
        [_b64(json.dumps(header).encode()), _b64(json.dumps(payload).encode()), _b64(signature)]
    )
    rejected(_STAGE, request(bearer(token)))


@settings(max_examples=100, deadline=None)
@given(
    alg=st_.sampled_from(["none", "NONE", "HS256", "RS256", "ES256", "HS512", "PS256"]),
    extra=st_.dictionaries(
        st_.sampled_from(["kid", "typ", "jku", "x5u", "crit"]), _json, max_size=3
    ),
)
def test_header_games_never_pass(alg: str, extra: dict[str, Any]) -> None:
    header = {"alg": alg, **extra}
    body = _b64(json.dumps(claims()).encode())
    token = f"{_b64(json.dumps(header).encode())}.{body}.{_b64(b'x' * 32)}"
    rejected(_STAGE, request(bearer(token)))

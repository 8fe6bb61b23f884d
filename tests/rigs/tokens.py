"""Credentials for tests: the shared HS256 secret, issuer and audience, RSA/EC keys,
JWT claims and tokens (signed, unsigned, forged by hand), and static token files."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

SECRET = "s3cret-shared-between-issuer-and-sidecar-0123456789"
ISSUER = "https://issuer.test"
AUDIENCE = "sidecar"

# Static tokens of the identities the PolicyTest cases of tests/policy_cases/ name.
CASE_TOKENS = [
    {"token": "alice", "user": "alice", "tenant": "acme", "groups": []},
    {"token": "oscar", "user": "oscar", "tenant": "acme", "groups": ["node-owners"]},
    {"token": "bea", "user": "bea", "tenant": "beta", "groups": ["node-owners"]},
    {"token": "carol", "user": "carol", "tenant": "beta", "groups": []},
    {"token": "bob", "user": "bob", "tenant": "beta", "groups": []},
    {"token": "ada", "user": "ada", "tenant": "acme", "groups": []},
    {"token": "vera", "user": "vera", "tenant": "acme", "groups": []},
    {"token": "root", "user": "root", "tenant": "system", "groups": []},
]


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def claims(
    user: str = "alice",
    tenant: str | None = "acme",
    groups: list[str] | str | None = None,
    lifetime: float = 600,
    **extra: Any,
) -> dict[str, Any]:
    now = int(time.time())
    body: dict[str, Any] = {
        "sub": user,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "nbf": now - 5,
        "exp": now + int(lifetime),
        "groups": groups if groups is not None else ["users"],
    }
    if tenant is not None:
        body["tenant"] = tenant
    body.update(extra)
    # `iss=None` / `aud=None` leave the claim out.
    return {k: v for k, v in body.items() if v is not None}


def hs256(payload: dict[str, Any], secret: str = SECRET) -> str:
    return jwt.encode(payload, secret, algorithm="HS256")


def unsigned(payload: dict[str, Any]) -> str:
    """A token with `alg: none` and an empty signature."""
    return jwt.encode(payload, "", algorithm="none")


def forge_hs256(payload: dict[str, Any], secret: bytes) -> str:
    """HS256 by hand, since PyJWT itself refuses a PEM key as an HMAC secret."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(json.dumps(payload).encode())
    sig = hmac.new(secret, signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{b64(sig)}"

"""The keys JWTs may be verified with (DESIGN §4), each bound to the only algorithms
it may verify: an HS* shared secret, a PEM public key or certificate (RS*/PS*/ES*/
EdDSA by key type), and the signing keys of a JWKS file.

JWKS entries are built with PyJWT's `PyJWK`. `PyJWKSet` is not used: it skips a key it
cannot read without a word, and a typo in a rotated JWKS file must be refused (the
last good keys stay in force) rather than silently drop the key. An empty key or JWKS
file is refused too (sidecar/services/identity/files.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.algorithms import get_default_algorithms

from sidecar.config.settings import ConfigError, JwtConfig
from sidecar.services.identity.files import CredentialFileError, read_credential_file

PUBLIC_KEY_FILE = "identity.jwt.publicKeyFile"
JWKS_FILE = "identity.jwt.jwksFile"
HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_CURVES = {
    "secp256r1": "ES256",
    "secp384r1": "ES384",
    "secp521r1": "ES512",
    "secp256k1": "ES256K",
}
_JWK_EC_CURVES = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512", "secp256k1": "ES256K"}


@dataclass(frozen=True, slots=True)
class VerificationKey:
    """A key and the only algorithms it may verify."""

    key: Any
    algorithms: frozenset[str]
    kid: str | None
    source: str


def load_jwt_keys(cfg: JwtConfig) -> list[VerificationKey]:
    """The verification keys of the config, each bound to its algorithm family.
    Raises ConfigError naming the key and the problem."""
    known = set(get_default_algorithms()) - {"none"}
    allowed = frozenset(cfg.algorithms)
    for alg in cfg.algorithms:
        if alg not in known:
            raise ConfigError(
                f"identity.jwt.algorithms: {alg!r} is not a supported signing algorithm"
            )
    keys: list[VerificationKey] = []
    if cfg.secret:
        secret = cfg.secret.encode("utf-8")
        if b"-----BEGIN" in secret:
            raise ConfigError("identity.jwt.secret looks like a PEM key; use publicKeyFile")
        algorithms = HMAC_ALGORITHMS & allowed
        if not algorithms:
            raise ConfigError(
                "identity.jwt.secret is set but identity.jwt.algorithms has no HS* algorithm"
            )
        keys.append(VerificationKey(secret, algorithms, None, "identity.jwt.secret"))
    if cfg.public_key_file:
        public = _load_pem_public_key(cfg.public_key_file)
        algorithms = _algorithms_for_public_key(public) & allowed
        if not algorithms:
            raise CredentialFileError(
                PUBLIC_KEY_FILE,
                cfg.public_key_file,
                f"identity.jwt.algorithms {sorted(allowed)} has no algorithm for the key in it",
            )
        keys.append(VerificationKey(public, algorithms, None, cfg.public_key_file))
    if cfg.jwks_file:
        keys += _jwks_keys(cfg.jwks_file, allowed)
    return keys


def _algorithms_for_public_key(key: Any) -> frozenset[str]:
    if isinstance(key, rsa.RSAPublicKey):
        return RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC_CURVES.get(key.curve.name)
        return frozenset({alg}) if alg else frozenset()
    if isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return frozenset({"EdDSA"})
    return frozenset()


def _load_pem_public_key(path: str) -> Any:
    data = read_credential_file(PUBLIC_KEY_FILE, path)
    try:
        return serialization.load_pem_public_key(data)
    except ValueError:
        pass
    try:
        return x509.load_pem_x509_certificate(data).public_key()
    except ValueError:
        raise CredentialFileError(
            PUBLIC_KEY_FILE, path, "holds no PEM public key or certificate"
        ) from None


def _jwk_family(jwk: dict[str, Any]) -> frozenset[str] | None:
    """The algorithms a JWK's key type may verify; None for an unsupported type."""
    kty = jwk.get("kty")
    if kty == "RSA":
        return RSA_ALGORITHMS
    if kty == "EC":
        alg = _JWK_EC_CURVES.get(str(jwk.get("crv")))
        return frozenset({alg}) if alg else frozenset()
    if kty == "OKP" and jwk.get("crv") in ("Ed25519", "Ed448"):
        return frozenset({"EdDSA"})
    if kty == "oct":
        return HMAC_ALGORITHMS
    return None


def _jwks_keys(path: str, allowed: frozenset[str]) -> list[VerificationKey]:
    def fault(problem: str) -> CredentialFileError:
        return CredentialFileError(JWKS_FILE, path, problem)

    raw = read_credential_file(JWKS_FILE, path)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise fault("not UTF-8 text") from None
    except ValueError as exc:
        # json's message says where (line, column), never what is there.
        raise fault(f"not valid JSON: {exc}") from None
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise fault("expected an object with a non-empty 'keys' list")
    keys: list[VerificationKey] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise fault(f"keys[{i}] is not an object")
        if entry.get("use", "sig") != "sig":
            continue  # encryption keys never verify signatures
        family = _jwk_family(entry)
        if family is None:
            raise fault(f"keys[{i}] has an unsupported key type {str(entry.get('kty'))[:20]!r}")
        declared = entry.get("alg")
        if declared is not None:
            if declared not in family:
                raise fault(
                    f"keys[{i}] declares alg {str(declared)[:20]!r}, which is not for a "
                    f"{entry.get('kty')} key"
                )
            family = frozenset({declared})
        algorithms = family & allowed
        if not algorithms:
            continue
        try:
            # The key is the same object for every algorithm of its family.
            jwk = jwt.PyJWK(entry, algorithm=sorted(algorithms)[0])
        except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
            # Some PyJWT messages quote the whole JWK (an `oct` key is a secret).
            text = str(exc) if "{" not in str(exc) else type(exc).__name__
            raise fault(f"keys[{i}] is not a valid key: {text[:120]}") from None
        kid = jwk.key_id
        keys.append(
            VerificationKey(
                jwk.key, algorithms, kid if isinstance(kid, str) else None, f"{path}#{i}"
            )
        )
    if not keys:
        raise fault(f"no signing key usable with identity.jwt.algorithms {sorted(allowed)}")
    return keys

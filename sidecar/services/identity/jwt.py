"""JWT bearer tokens (DESIGN §4), verified with PyJWT.

A token is tried with the configured keys (`keys.py`) whose algorithm family holds the
token header's `alg`; the header only chooses among those, so `alg: none` and
algorithm confusion (an HS256 token "signed" with the RSA public key) find no key and
fail. `exp` is required unless `identity.jwt.requireExp: false`; `nbf`, `iss` and `aud`
are checked. Verified tokens are cached (bounded, never past `exp`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jwt
from aiohttp import web
from cachetools import TLRUCache

from sidecar.config.settings import JwtConfig
from sidecar.core.identity import Identity
from sidecar.core.redact import redact_text
from sidecar.services.identity.keys import VerificationKey
from sidecar.services.identity.names import JWT, printable, reject, tenant_name

# A decoded token without `exp` is still re-verified after this long.
MAX_CACHE_SECONDS = 300.0


def _claim(payload: Mapping[str, Any], name: str) -> Any:
    """A claim by name; a dotted name walks nested objects (`realm.tenant`)."""
    if name in payload:
        return payload[name]
    node: Any = payload
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _looks_like_jwt(token: str) -> dict[str, Any] | None:
    """The unverified JOSE header when `token` is shaped like a JWS, else None."""
    if token.count(".") != 2:
        return None
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        return None
    return header if "alg" in header else None


class JwtAuthenticator:
    name = JWT

    def __init__(self, cfg: JwtConfig, keys: Sequence[VerificationKey]) -> None:
        self.cfg = cfg
        self.keys = tuple(keys)
        self.algorithms = frozenset(cfg.algorithms)
        self.claims = cfg.claims
        self.leeway = cfg.leeway_seconds
        self.options: dict[str, Any] = {"require": []}
        if cfg.require_exp:
            # A token without `exp` would be valid forever (DESIGN §4).
            self.options["require"].append("exp")
        if cfg.issuer is not None:
            self.options["require"].append("iss")
        if cfg.audience is not None:
            self.options["require"].append("aud")
        # sha256(token) -> (identity, expires_at); each entry lives until the token's
        # exp (or MAX_CACHE_SECONDS), whichever comes first.
        self.cache: TLRUCache[bytes, tuple[Identity, float]] = TLRUCache(
            maxsize=max(cfg.cache_size, 1), ttu=_until_expiry, timer=_now
        )

    def authenticate(self, request: web.Request, bearer: str | None) -> Identity | None:
        if bearer is None:
            return None
        digest = hashlib.sha256(bearer.encode()).digest()
        hit = self.cache.get(digest)
        if hit is not None and time.time() < hit[1]:
            return hit[0]
        header = _looks_like_jwt(bearer)
        if header is None:
            return None
        identity, expires = self.verify(bearer, header)
        if self.cfg.cache_size > 0:
            self.cache[digest] = (identity, expires)
        return identity

    def verify(self, token: str, header: Mapping[str, Any]) -> tuple[Identity, float]:
        alg = header.get("alg")
        if not isinstance(alg, str):
            raise reject("the token header has no valid alg")
        if alg.lower() == "none":
            raise reject("unsigned tokens (alg none) are not accepted")
        if alg not in self.algorithms:
            raise reject(f"token algorithm {alg[:20]!r} is not accepted")
        kid = header.get("kid")
        candidates = [k for k in self.keys if alg in k.algorithms]
        if isinstance(kid, str) and any(k.kid == kid for k in candidates):
            candidates = [k for k in candidates if k.kid == kid]
        if not candidates:
            raise reject(f"no verification key is configured for algorithm {alg}")
        payload: dict[str, Any] | None = None
        for key in candidates:
            try:
                payload = jwt.decode(
                    token,
                    key.key,
                    algorithms=[alg],
                    audience=self.cfg.audience,
                    issuer=self.cfg.issuer,
                    leeway=self.leeway,
                    options=self.options,  # type: ignore[arg-type]
                )
                break
            except jwt.InvalidSignatureError:
                continue
            except jwt.ExpiredSignatureError:
                raise reject("the token has expired") from None
            except jwt.ImmatureSignatureError:
                raise reject("the token is not valid yet (nbf/iat in the future)") from None
            except jwt.InvalidAudienceError:
                raise reject("the token's audience is not accepted") from None
            except jwt.InvalidIssuerError:
                raise reject("the token's issuer is not accepted") from None
            except jwt.MissingRequiredClaimError as exc:
                if exc.claim == "exp":
                    raise reject(
                        "the token has no 'exp' claim: tokens must expire (identity.jwt.requireExp)"
                    ) from None
                raise reject(f"the token has no {exc.claim!r} claim") from None
            except jwt.InvalidKeyError:
                continue
            except jwt.PyJWTError as exc:
                # PyJWT's messages name the problem; redacted all the same, since
                # a 401 body must never quote the token (DESIGN §9).
                raise reject(f"invalid token: {redact_text(str(exc))[:120]}") from None
        if payload is None:
            raise reject("the token signature does not verify")
        return self._identity(payload), _expiry(payload)

    def _identity(self, payload: Mapping[str, Any]) -> Identity:
        names = self.claims
        user = _claim(payload, names.user)
        if not isinstance(user, str) or not user:
            raise reject(f"the token has no {names.user!r} (user) claim")
        if not printable(user):
            raise reject(f"the token's {names.user!r} claim is not a valid user name")
        tenant_value = _claim(payload, names.tenant)
        if tenant_value is None:
            raise reject(f"the token has no {names.tenant!r} (tenant) claim")
        tenant = tenant_name(tenant_value, f"the token's {names.tenant!r} claim")
        raw_groups = _claim(payload, names.groups)
        if raw_groups is None:
            groups: tuple[str, ...] = ()
        elif isinstance(raw_groups, str):
            groups = (raw_groups,)
        elif isinstance(raw_groups, list) and all(isinstance(g, str) for g in raw_groups):
            groups = tuple(raw_groups)
        else:
            raise reject(f"the token's {names.groups!r} claim is not a list of strings")
        if not all(printable(g) for g in groups):
            raise reject(f"the token's {names.groups!r} claim has an invalid group name")
        return Identity(user, tenant, groups, JWT)


def _expiry(payload: Mapping[str, Any]) -> float:
    exp = payload.get("exp")
    cap = time.time() + MAX_CACHE_SECONDS
    if isinstance(exp, (int, float)) and not isinstance(exp, bool):
        return min(float(exp), cap)
    return cap


def _now() -> float:
    return time.time()


def _until_expiry(_key: bytes, value: tuple[Identity, float], _now: float) -> float:
    return value[1]

"""Authentication (DESIGN §4): the request's credentials become an `Identity`.

Three authenticators, tried in this order, the first that recognises the request wins:

- `JwtAuthenticator`: a bearer token shaped like a JWT, verified with PyJWT against an
  HS* shared secret, a PEM public key (RS*/PS*/ES*/EdDSA) or a JWKS file. Each key
  carries the algorithm family it is for; the token header only chooses among those,
  so `alg: none` and algorithm confusion (an HS256 token "signed" with the RSA public
  key) find no key and fail. Verified tokens are cached (bounded, never past `exp`).
- `StaticTokenAuthenticator`: an opaque bearer token looked up in a YAML file.
- `TrustedHeaderAuthenticator`: `X-Remote-User`/`-Tenant`/`-Group` set by a front
  proxy, only when enabled and only from the configured client addresses.

The stage then sets `ctx.identity` and `ctx.tenant_label` and resolves short paths to
the caller's tenant. `CredentialWatcher` re-reads the token file and the JWT key / JWKS
files when they change: a file that fails to load keeps the last good credentials,
is logged, and shows in `/readyz` (DESIGN §4). Incoming `X-Remote-*` headers of a
request that did not come through the trusted-header authenticator are dropped from
the request, so no later stage can read a spoofed value (the proxy also drops them
and sets its own).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import os
import re
import time
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt
import yaml
from aiohttp import web
from cachetools import TLRUCache
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.algorithms import get_default_algorithms

from sidecar.config import ConfigError, IdentityConfig, JwtConfig, TrustedHeaders
from sidecar.context import Identity, RequestContext
from sidecar.errors import StatusError, unauthorized
from sidecar.pipeline import Handler, Stage
from sidecar.runtime import Runtime
from sidecar.target import is_dns1123_label

__all__ = [
    "Authenticator",
    "CredentialWatcher",
    "IdentityStage",
    "JwtAuthenticator",
    "StaticTokenAuthenticator",
    "TrustedHeaderAuthenticator",
    "build_authenticators",
    "make_stage",
]

log = logging.getLogger("sidecar.identity")

JWT = "jwt"
STATIC = "static-token"
TRUSTED = "trusted-headers"

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_CURVES = {
    "secp256r1": "ES256",
    "secp384r1": "ES384",
    "secp521r1": "ES512",
    "secp256k1": "ES256K",
}
_JWK_EC_CURVES = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512", "secp256k1": "ES256K"}
# A decoded token without `exp` is still re-verified after this long.
MAX_CACHE_SECONDS = 300.0
# RFC 6750 b64token.
_BEARER = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
_MAX_TOKEN = 16 * 1024
_REMOTE_PREFIX = "x-remote-"
_MAX_NAME = 256


class Authenticator(Protocol):
    """Returns the caller, or None when the request carries nothing it recognises.
    Recognised but invalid credentials raise a 401 `StatusError` with the reason."""

    name: str

    def authenticate(self, request: web.Request, bearer: str | None) -> Identity | None: ...


def _reject(message: str) -> StatusError:
    return unauthorized(message)


# Control characters (C0 and C1, e.g. U+0085), line and paragraph separators
# (U+2028, U+2029) and lone surrogates: a name holding one could break a log line.
_NOT_IN_NAMES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def _printable(value: str) -> bool:
    """User and group names become header values and log fields: bounded, and no
    character that any reader could take for a line break or a control."""
    return 0 < len(value) <= _MAX_NAME and not any(
        unicodedata.category(c) in _NOT_IN_NAMES for c in value
    )


def _tenant(value: object, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise _reject(f"{source} has no tenant")
    if not is_dns1123_label(value):
        raise _reject(f"the tenant {value[:70]!r} of {source} is not a DNS-1123 label")
    return value


# -- JWT --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerificationKey:
    """A key and the only algorithms it may verify."""

    key: Any
    algorithms: frozenset[str]
    kid: str | None
    source: str


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
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"identity.jwt.publicKeyFile: cannot read {path}: {exc.strerror}"
        ) from None
    try:
        return serialization.load_pem_public_key(data)
    except ValueError:
        pass
    try:
        return x509.load_pem_x509_certificate(data).public_key()
    except ValueError:
        raise ConfigError(
            f"identity.jwt.publicKeyFile: {path} holds no PEM public key or certificate"
        ) from None


def _jwks_keys(path: str, allowed: frozenset[str]) -> list[VerificationKey]:
    where = f"identity.jwt.jwksFile: {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc}") from None
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: expected an object with a non-empty 'keys' list")
    registry = get_default_algorithms()
    keys: list[VerificationKey] = []
    for i, jwk in enumerate(entries):
        if not isinstance(jwk, dict):
            raise ConfigError(f"{where}: keys[{i}] is not an object")
        if jwk.get("use", "sig") != "sig":
            continue  # encryption keys never verify signatures
        kty = jwk.get("kty")
        if kty == "RSA":
            family = RSA_ALGORITHMS
        elif kty == "EC":
            alg = _JWK_EC_CURVES.get(str(jwk.get("crv")))
            family = frozenset({alg}) if alg else frozenset()
        elif kty == "OKP" and jwk.get("crv") in ("Ed25519", "Ed448"):
            family = frozenset({"EdDSA"})
        elif kty == "oct":
            family = HMAC_ALGORITHMS
        else:
            raise ConfigError(f"{where}: keys[{i}] has an unsupported key type {kty!r}")
        declared = jwk.get("alg")
        if declared is not None:
            if declared not in family:
                raise ConfigError(
                    f"{where}: keys[{i}] declares alg {declared!r}, which is not for a {kty} key"
                )
            family = frozenset({declared})
        algorithms = family & allowed
        if not algorithms:
            continue
        try:
            key = registry[sorted(algorithms)[0]].from_jwk(jwk)
        except (jwt.InvalidKeyError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{where}: keys[{i}] is not a valid key: {exc}") from None
        kid = jwk.get("kid")
        keys.append(
            VerificationKey(key, algorithms, kid if isinstance(kid, str) else None, f"{path}#{i}")
        )
    if not keys:
        raise ConfigError(
            f"{where}: no signing key usable with identity.jwt.algorithms {sorted(allowed)}"
        )
    return keys


def load_jwt_keys(cfg: JwtConfig) -> list[VerificationKey]:
    """The verification keys of the config, each bound to its algorithm family."""
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
            raise ConfigError(
                f"identity.jwt.publicKeyFile: identity.jwt.algorithms {sorted(allowed)} has "
                f"no algorithm for the key in {cfg.public_key_file}"
            )
        keys.append(VerificationKey(public, algorithms, None, cfg.public_key_file))
    if cfg.jwks_file:
        keys += _jwks_keys(cfg.jwks_file, allowed)
    return keys


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
            raise _reject("the token header has no valid alg")
        if alg.lower() == "none":
            raise _reject("unsigned tokens (alg none) are not accepted")
        if alg not in self.algorithms:
            raise _reject(f"token algorithm {alg[:20]!r} is not accepted")
        kid = header.get("kid")
        candidates = [k for k in self.keys if alg in k.algorithms]
        if isinstance(kid, str) and any(k.kid == kid for k in candidates):
            candidates = [k for k in candidates if k.kid == kid]
        if not candidates:
            raise _reject(f"no verification key is configured for algorithm {alg}")
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
                raise _reject("the token has expired") from None
            except jwt.ImmatureSignatureError:
                raise _reject("the token is not valid yet (nbf/iat in the future)") from None
            except jwt.InvalidAudienceError:
                raise _reject("the token's audience is not accepted") from None
            except jwt.InvalidIssuerError:
                raise _reject("the token's issuer is not accepted") from None
            except jwt.MissingRequiredClaimError as exc:
                if exc.claim == "exp":
                    raise _reject(
                        "the token has no 'exp' claim: tokens must expire (identity.jwt.requireExp)"
                    ) from None
                raise _reject(f"the token has no {exc.claim!r} claim") from None
            except jwt.InvalidKeyError:
                continue
            except jwt.PyJWTError as exc:
                raise _reject(f"invalid token: {str(exc)[:120]}") from None
        if payload is None:
            raise _reject("the token signature does not verify")
        return self._identity(payload), _expiry(payload)

    def _identity(self, payload: Mapping[str, Any]) -> Identity:
        names = self.claims
        user = _claim(payload, names.user)
        if not isinstance(user, str) or not user:
            raise _reject(f"the token has no {names.user!r} (user) claim")
        if not _printable(user):
            raise _reject(f"the token's {names.user!r} claim is not a valid user name")
        tenant_value = _claim(payload, names.tenant)
        if tenant_value is None:
            raise _reject(f"the token has no {names.tenant!r} (tenant) claim")
        tenant = _tenant(tenant_value, f"the token's {names.tenant!r} claim")
        raw_groups = _claim(payload, names.groups)
        if raw_groups is None:
            groups: tuple[str, ...] = ()
        elif isinstance(raw_groups, str):
            groups = (raw_groups,)
        elif isinstance(raw_groups, list) and all(isinstance(g, str) for g in raw_groups):
            groups = tuple(raw_groups)
        else:
            raise _reject(f"the token's {names.groups!r} claim is not a list of strings")
        if not all(_printable(g) for g in groups):
            raise _reject(f"the token's {names.groups!r} claim has an invalid group name")
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


# -- static tokens ------------------------------------------------------------------


def load_token_file(path: str) -> dict[bytes, Identity]:
    """The YAML list `[{token, user, tenant, groups}]`, keyed by sha256(token)."""
    where = f"identity.tokenFile: {path}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if data is None:
        data = []
    if not isinstance(data, list):
        raise ConfigError(f"{where}: expected a list of {{token, user, tenant, groups}}")
    tokens: dict[bytes, Identity] = {}
    for i, entry in enumerate(data):
        item = f"{where}: entry {i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{item} is not a mapping")
        unknown = set(entry) - {"token", "user", "tenant", "groups"}
        if unknown:
            raise ConfigError(f"{item} has unknown keys {sorted(map(str, unknown))}")
        token, user, tenant = entry.get("token"), entry.get("user"), entry.get("tenant")
        groups = entry.get("groups") or []
        if not isinstance(token, str) or not _BEARER.match(token):
            raise ConfigError(f"{item}: token must be a non-empty bearer token string")
        if not isinstance(user, str) or not _printable(user):
            raise ConfigError(f"{item}: user must be a non-empty string without control characters")
        if not isinstance(tenant, str) or not is_dns1123_label(tenant):
            raise ConfigError(f"{item}: tenant {tenant!r} is not a DNS-1123 label")
        if not isinstance(groups, list) or not all(
            isinstance(g, str) and _printable(g) for g in groups
        ):
            raise ConfigError(f"{item}: groups must be a list of strings")
        digest = hashlib.sha256(token.encode()).digest()
        if digest in tokens:
            raise ConfigError(f"{item}: the same token appears twice")
        tokens[digest] = Identity(user, tenant, tuple(groups), STATIC)
    return tokens


class StaticTokenAuthenticator:
    name = STATIC

    def __init__(self, tokens: Mapping[bytes, Identity]) -> None:
        self.tokens = dict(tokens)

    def authenticate(self, request: web.Request, bearer: str | None) -> Identity | None:
        if bearer is None:
            return None
        return self.tokens.get(hashlib.sha256(bearer.encode()).digest())


# -- trusted front-proxy headers ------------------------------------------------------


class TrustedHeaderAuthenticator:
    name = TRUSTED

    def __init__(self, cfg: TrustedHeaders) -> None:
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for i, client in enumerate(cfg.clients):
            try:
                networks.append(ipaddress.ip_network(client.strip(), strict=False))
            except ValueError:
                raise ConfigError(
                    f"identity.trustedHeaders.clients[{i}]: {client!r} is not an IP address or CIDR"
                ) from None
        self.networks = tuple(networks)

    def trusts(self, remote: str | None) -> bool:
        if not remote:
            return False
        try:
            address = ipaddress.ip_address(remote.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self.networks)

    def authenticate(self, request: web.Request, bearer: str | None) -> Identity | None:
        headers = request.headers
        if "X-Remote-User" not in headers or not self.trusts(request.remote):
            return None
        users = headers.getall("X-Remote-User")
        if len(users) != 1 or not users[0].strip():
            raise _reject("the front proxy must send exactly one non-empty X-Remote-User")
        user = users[0].strip()
        if not _printable(user):
            raise _reject("the X-Remote-User header is not a valid user name")
        tenants = headers.getall("X-Remote-Tenant", [])
        if len(tenants) != 1:
            raise _reject("the front proxy must send exactly one X-Remote-Tenant")
        tenant = _tenant(tenants[0].strip(), "the X-Remote-Tenant header")
        groups = tuple(g.strip() for g in headers.getall("X-Remote-Group", []) if g.strip())
        if not all(_printable(g) for g in groups):
            raise _reject("an X-Remote-Group header is not a valid group name")
        return Identity(user, tenant, groups, TRUSTED)


# -- the stage -------------------------------------------------------------------------


def build_authenticators(cfg: IdentityConfig) -> list[Authenticator]:
    """The configured authenticators in their fixed order; raises ConfigError."""
    found: list[Authenticator] = []
    keys = load_jwt_keys(cfg.jwt)
    if keys:
        found.append(JwtAuthenticator(cfg.jwt, keys))
    if cfg.token_file:
        found.append(StaticTokenAuthenticator(load_token_file(cfg.token_file)))
    if cfg.trusted_headers.enabled:
        found.append(TrustedHeaderAuthenticator(cfg.trusted_headers))
    return found


def parse_authorization(request: web.Request) -> tuple[str | None, str]:
    """(bearer token, problem): the token of a well-formed `Bearer` header, else the
    reason the Authorization header cannot be used ("" when there is none)."""
    values = request.headers.getall("Authorization", [])
    if not values:
        return None, ""
    if len(values) > 1:
        return None, "more than one Authorization header"
    scheme, _, rest = values[0].strip().partition(" ")
    if scheme.lower() != "bearer":
        return None, "the Authorization header is not a Bearer token"
    token = rest.strip()
    if not token:
        return None, "the Bearer token is empty"
    if len(token) > _MAX_TOKEN or not _BEARER.match(token):
        return None, "the Bearer token is malformed"
    return token, ""


class IdentityStage:
    name = "identity"

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self.authenticators = tuple(authenticators)

    def authenticate(self, request: web.Request) -> Identity:
        bearer, problem = parse_authorization(request)
        for authenticator in self.authenticators:
            identity = authenticator.authenticate(request, bearer)
            if identity is not None:
                return identity
        if problem:
            raise _reject(problem)
        if bearer is not None:
            raise _reject("the bearer token is not valid")
        raise _reject("no credentials: send an Authorization: Bearer token")

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        identity = self.authenticate(ctx.request)
        ctx.identity = identity
        ctx.tenant_label = identity.tenant
        ctx.audit["authenticator"] = identity.authenticator
        if identity.authenticator != TRUSTED:
            _strip_remote_headers(ctx)
        if ctx.target is not None and ctx.target.resource_request:
            ctx.target = ctx.target.resolve_tenant(identity.tenant)
        return await call_next(ctx)


def _strip_remote_headers(ctx: RequestContext) -> None:
    request = ctx.request
    if not any(name.lower().startswith(_REMOTE_PREFIX) for name in request.headers):
        return
    kept = [(k, v) for k, v in request.headers.items() if not k.lower().startswith(_REMOTE_PREFIX)]
    ctx.audit["strippedRemoteHeaders"] = len(request.headers) - len(kept)
    try:
        ctx.request = request.clone(headers=kept)
    except (UnicodeEncodeError, RuntimeError):
        # Undecodable header bytes: keep the request; the proxy drops X-Remote-* anyway.
        pass


# How often the credential files are checked for a change (one stat() each).
CREDENTIAL_POLL_SECONDS = 1.0


def credential_files(cfg: IdentityConfig) -> list[str]:
    return [p for p in (cfg.token_file, cfg.jwt.public_key_file, cfg.jwt.jwks_file) if p]


def _fingerprint(paths: Sequence[str]) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class CredentialWatcher:
    """Rebuilds the stage's authenticators when a credential file changes.

    The fingerprint is taken before the files are read, so a write that lands while
    they are being read changes it again and is read on the next poll."""

    def __init__(
        self, stage: IdentityStage, cfg: IdentityConfig, interval: float = CREDENTIAL_POLL_SECONDS
    ) -> None:
        self.stage = stage
        self.cfg = cfg
        self.files = credential_files(cfg)
        self.interval = interval
        self.seen = _fingerprint(self.files)
        self.failed = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.files and self._task is None:
            self._task = asyncio.create_task(self._poll(), name="credential-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = _fingerprint(self.files)
            if now != self.seen:
                self.seen = now
                await self.reload()

    async def reload(self) -> bool:
        try:
            found = await asyncio.to_thread(build_authenticators, self.cfg)
        except ConfigError as exc:
            self.failed = True
            log.warning(
                "credential reload refused; the last good credentials stay in force: %s", exc
            )
            return False
        self.stage.authenticators = tuple(found)
        if self.failed:
            log.warning("credential reload succeeded again")
        else:
            log.info("credentials reloaded")
        self.failed = False
        return True

    async def ready(self) -> tuple[bool, str]:
        if self.failed:
            return False, (
                "credential reload failed (see the log); the last good credentials are in force"
            )
        return True, "credentials loaded"


def make_stage(rt: Runtime) -> Stage:
    stage = IdentityStage(build_authenticators(rt.config.identity))
    watcher = CredentialWatcher(stage, rt.config.identity)
    if watcher.files:
        rt.on_startup.append(watcher.start)
        rt.on_cleanup.append(watcher.stop)
        rt.ready_checks["credentials"] = watcher.ready
    return stage

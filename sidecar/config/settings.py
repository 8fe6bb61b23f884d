"""Sidecar configuration: one YAML file, `SIDECAR_…` environment overrides, defaults.

The schema is a tree of frozen dataclasses; YAML keys are the camelCase form of the
field names (`concealOtherTenants`), environment variables the upper-snake form with
`__` between levels (`SIDECAR_IDENTITY__TOKEN_FILE`). Environment values are parsed as
YAML scalars/lists (`5`, `true`, `[HS256]`). An unknown key or a wrong type raises
`ConfigError` naming the key, before anything starts.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from sidecar.core.redact import yaml_problem

ENV_PREFIX = "SIDECAR_"
# Names the config file for the commands that read it (`sidecar quota`); not a key.
CONFIG_FILE_ENV = "SIDECAR_CONFIG"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the offending key."""


@dataclass(frozen=True)
class JwtClaims:
    user: str = "sub"
    tenant: str = "tenant"
    groups: str = "groups"


@dataclass(frozen=True)
class JwtConfig:
    algorithms: list[str] = field(default_factory=lambda: ["HS256"])
    secret: str | None = None
    public_key_file: str | None = None
    jwks_file: str | None = None
    issuer: str | None = None
    audience: str | None = None
    leeway_seconds: float = 0.0
    claims: JwtClaims = field(default_factory=JwtClaims)
    cache_size: int = 10000
    # A token without `exp` never expires; refused unless this is turned off (DESIGN §4).
    require_exp: bool = True


@dataclass(frozen=True)
class TrustedHeaders:
    enabled: bool = False
    clients: list[str] = field(default_factory=lambda: ["127.0.0.1"])


@dataclass(frozen=True)
class IdentityConfig:
    token_file: str | None = None
    jwt: JwtConfig = field(default_factory=JwtConfig)
    trusted_headers: TrustedHeaders = field(default_factory=TrustedHeaders)
    forward_authorization: bool = True
    # More request headers the upstream trusts as identity, never forwarded (DESIGN §4).
    strip_headers: list[str] = field(default_factory=list)

    @functools.cached_property
    def strip_header_names(self) -> frozenset[str]:
        """`stripHeaders` lower-cased, `_` read as `-` (as some upstreams read them)."""
        return frozenset(h.lower().replace("_", "-") for h in self.strip_headers)


@dataclass(frozen=True)
class AnonymousLimit:
    """Per-client-address bucket for requests that carry no valid credentials."""

    rate: float = 20.0
    burst: int = 40


# The default Redis key prefixes of the rate limit's global tier and of the quota ledger.
RATE_LIMIT_REDIS_PREFIX = "sidecar:rl:"
QUOTA_REDIS_PREFIX = "sidecar:quota:"


@dataclass(frozen=True)
class RateLimitConfig:
    global_: str | None = field(default=None, metadata={"key": "global"})
    # Key prefix of the global tier in Redis (keys are `{prefix}{tenant}:bucket`).
    global_prefix: str = RATE_LIMIT_REDIS_PREFIX
    max_wait: float = 0.0
    max_buckets: int = 100000
    anonymous: AnonymousLimit = field(default_factory=AnonymousLimit)
    redis_timeout: float = 0.25
    fail_open_log_interval: float = 30.0


@dataclass(frozen=True)
class QuotaConfig:
    reservation_ttl_seconds: float = 300.0
    reconcile_interval_seconds: float = 0.0
    # Key prefix of the Redis ledger (lets several deployments share one Redis).
    redis_prefix: str = QUOTA_REDIS_PREFIX
    # How often the quota used/hard gauges on /metrics are refreshed from the ledger.
    gauge_interval_seconds: float = 5.0
    # A write whose outcome the sidecar did not see is released on a 404 read-back only
    # once this long has passed since its exchange ended (the upstream may still be
    # acting on it; DESIGN §7). None: until the reservation expires (the TTL), which
    # also bounds any value.
    settle_after_seconds: float | None = None


@dataclass(frozen=True)
class TlsConfig:
    """Both set: serve HTTPS (kubectl sends tokens only over TLS). Re-read on change."""

    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True)
class AuditConfig:
    path: str = "-"
    queue_size: int = 10000


@dataclass(frozen=True)
class LimitsConfig:
    max_body_bytes: int = 3 * 1024 * 1024
    max_header_bytes: int = 32 * 1024
    upstream_connect_timeout: float = 5.0
    upstream_read_timeout: float = 60.0
    upstream_pool_size: int = 256
    shutdown_grace_seconds: float = 30.0
    # A client that has not sent its complete request headers by then is disconnected.
    header_timeout: float = 10.0
    # Upstream connections all watches together may hold (a pool of their own, so
    # watches never take the connections ordinary requests need).
    upstream_watch_pool_size: int = 1024
    # Every watch ends after its own limit, drawn between 1 and 2 times of this (DESIGN §5).
    max_watch_seconds: float = 1800.0
    # A client that reads nothing of what waits for it for this long loses its connection
    # (sidecar/edge/write_deadline.py).
    client_write_timeout: float = 60.0


@dataclass(frozen=True)
class MetricsConfig:
    max_tenant_labels: int = 500


@dataclass(frozen=True)
class CacheConfig:
    decisions: int = 100000
    owners: int = 10000
    owner_ttl_seconds: float = 2.0


@dataclass(frozen=True)
class ReloadConfig:
    enabled: bool = True
    debounce_seconds: float = 0.5
    poll_seconds: float = 0.0  # 0 = use filesystem notifications (watchfiles)


@dataclass(frozen=True)
class AuthzConfig:
    """The decision service (DESIGN §13): `listen` answers Envoy (HTTP ext_authz),
    nginx (auth_request) and Kubernetes (SubjectAccessReview webhook); `grpcListen`
    answers Envoy's gRPC ext_authz. Both off by default; bind them to loopback."""

    listen: str | None = None
    grpc_listen: str | None = None
    # Allow answers kept per (credential, method, target) for the current policy and
    # credentials (sidecar/edge/authz/decider.py).
    cache: int = 20000
    # How long the proxy accepts the decider's "already decided" marker.
    marker_ttl_seconds: float = 30.0


@dataclass(frozen=True)
class Config:
    listen: str = "127.0.0.1:8443"
    tls: TlsConfig = field(default_factory=TlsConfig)
    # HOST:PORT serving /metrics without credentials (for a Prometheus scraper); off
    # by default, when /metrics is authorized on the main listener like any URL.
    metrics_listen: str | None = None
    upstream: str = "http://127.0.0.1:8080"
    policies: str = "./policies"
    mode: Literal["enforce", "dry-run"] = "enforce"
    conceal_other_tenants: bool = True
    identity: IdentityConfig = field(default_factory=IdentityConfig)
    ledger: str = "sqlite:///./.sidecar/ledger.db"
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    reload: ReloadConfig = field(default_factory=ReloadConfig)
    workers: int = 1
    # SIGTERM: /readyz answers 503 this long while requests are still served, before the
    # listener closes (set it to the load balancer's reaction time; DESIGN §9).
    shutdown_drain_seconds: float = 0.0
    # `auto`: uvloop when it is installed (a dependency on Linux and macOS), else
    # asyncio's own loop; `uvloop` refuses to start without it.
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    authz: AuthzConfig = field(default_factory=AuthzConfig)

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults, then the YAML file, then `SIDECAR_…` variables, then `overrides`."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            # Never PyYAML's snippet of the line: the config may hold the JWT secret.
            raise ConfigError(
                f"config file {path} is not valid YAML: {yaml_problem(exc)}"
            ) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must be a mapping at the top level")
        raw = loaded
    for name, value in sorted((os.environ if env is None else env).items()):
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            if name == CONFIG_FILE_ENV:
                continue
            _set_env(raw, name, value)
    for dotted, value in (overrides or {}).items():
        _set_path(raw, dotted.split("."), value)
    config: Config = _build(Config, raw, "")
    _validate(config)
    return config


def _validate(config: Config) -> None:
    host, sep, port = config.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"config key 'listen' must be HOST:PORT, not {config.listen!r}")
    if not config.upstream.startswith(("http://", "https://", "unix:")):
        raise ConfigError(
            f"config key 'upstream' must be an http(s):// URL or unix:/path, "
            f"not {config.upstream!r}"
        )
    if not config.ledger.startswith("sqlite://"):
        _check_redis_url("ledger", config.ledger, "sqlite:///path")
    if config.rate_limit.global_:
        _check_redis_url("rateLimit.global", config.rate_limit.global_)
    for key, prefix in (
        ("quota.redisPrefix", config.quota.redis_prefix),
        ("rateLimit.globalPrefix", config.rate_limit.global_prefix),
    ):
        if "{" in prefix or "}" in prefix:
            raise ConfigError(
                f"config key {key!r} must not hold '{{' or '}}' (the tenant is the key's "
                "hash tag, keeping a tenant's keys in one Redis Cluster slot)"
            )
    settle_after = config.quota.settle_after_seconds
    if settle_after is not None and not 0 <= settle_after <= config.quota.reservation_ttl_seconds:
        raise ConfigError(
            "config key 'quota.settleAfterSeconds' must be between 0 and "
            "'quota.reservationTtlSeconds' (a reservation is dropped when it expires)"
        )
    if config.metrics_listen is not None:
        mhost, msep, mport = config.metrics_listen.rpartition(":")
        if not msep or not mhost or not mport.isdigit() or not 0 < int(mport) < 65536:
            raise ConfigError(
                f"config key 'metricsListen' must be HOST:PORT, not {config.metrics_listen!r}"
            )
    for key, address in (
        ("authz.listen", config.authz.listen),
        ("authz.grpcListen", config.authz.grpc_listen),
    ):
        if address is not None:
            ahost, asep, aport = address.rpartition(":")
            if not asep or not ahost or not aport.isdigit() or not 0 < int(aport) < 65536:
                raise ConfigError(f"config key {key!r} must be HOST:PORT, not {address!r}")
    if (config.tls.cert_file is None) != (config.tls.key_file is None):
        raise ConfigError("config keys 'tls.certFile' and 'tls.keyFile' must be set together")
    if config.limits.header_timeout <= 0:
        raise ConfigError("config key 'limits.headerTimeout' must be positive")
    if config.workers < 1:
        raise ConfigError("config key 'workers' must be at least 1")
    if config.limits.max_body_bytes < 1:
        raise ConfigError("config key 'limits.maxBodyBytes' must be positive")
    if config.limits.max_watch_seconds <= 0:
        raise ConfigError("config key 'limits.maxWatchSeconds' must be positive")
    if config.limits.client_write_timeout <= 0:
        raise ConfigError("config key 'limits.clientWriteTimeout' must be positive")
    for i, name in enumerate(config.identity.strip_headers):
        if not _TOKEN.match(name):
            raise ConfigError(f"config key 'identity.stripHeaders[{i}]' is not a header name")
        if name.lower().replace("_", "-") in _FRAMING_HEADERS:
            raise ConfigError(
                f"config key 'identity.stripHeaders[{i}]': {name} says how to read the "
                "request, it cannot be stripped"
            )


# An HTTP header name (RFC 9110 token).
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# Headers without which the upstream would read the body or the target otherwise.
_FRAMING_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "content-type", "content-encoding"}
)


def _check_redis_url(key: str, url: str, other: str = "") -> None:
    """A Redis URL that could not be used stops start-up here, naming the key (never
    the URL: it may hold a password). `other`: the key's other accepted form."""
    from sidecar.config.redis_url import RedisUrlError, parse_redis_url

    try:
        parse_redis_url(url)
    except RedisUrlError as exc:
        hint = f" (or {other})" if other else ""
        raise ConfigError(f"config key {key!r}: {exc}{hint}") from None


def config_to_dict(config: Any) -> Any:
    """The config as YAML-shaped data (camelCase keys), for `--print-config` and tests."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        fields = dataclasses.fields(config)
        return {_key(f): config_to_dict(getattr(config, f.name)) for f in fields}
    if isinstance(config, list):
        return [config_to_dict(v) for v in config]
    return config


def _key(f: dataclasses.Field[Any]) -> str:
    explicit = f.metadata.get("key")
    if explicit:
        return str(explicit)
    head, *rest = f.name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _norm(key: str) -> str:
    return key.replace("_", "").lower()


def _set_env(raw: dict[str, Any], name: str, value: str) -> None:
    parts = [p for p in name[len(ENV_PREFIX) :].split("__")]
    try:
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError:
        parsed = value
    _set_path(raw, parts, parsed, env_name=name)


def _set_path(raw: dict[str, Any], parts: list[str], value: Any, env_name: str = "") -> None:
    """Set a nested key, matching existing keys case- and underscore-insensitively."""
    node = raw
    cls: Any = Config
    for i, part in enumerate(parts):
        fields = {_norm(_key(f)): f for f in dataclasses.fields(cls)} if cls else {}
        f = fields.get(_norm(part))
        if f is None:
            shown = env_name or ".".join(parts)
            raise ConfigError(f"unknown config key {'.'.join(parts[: i + 1])!r} (from {shown})")
        key = _key(f)
        if i == len(parts) - 1:
            node[key] = value
            return
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
        hint = typing.get_type_hints(cls)[f.name]
        cls = hint if dataclasses.is_dataclass(hint) else None


def _build(cls: Any, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"config key {where or '<top>'!r} must be a mapping")
    hints = typing.get_type_hints(cls)
    by_key = {_key(f): f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in by_key:
            path = f"{where}.{key}" if where else str(key)
            raise ConfigError(f"unknown config key {path!r}")
    kwargs: dict[str, Any] = {}
    for key, f in by_key.items():
        path = f"{where}.{key}" if where else key
        if key in raw:
            kwargs[f.name] = _coerce(hints[f.name], raw[key], path)
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], {}, path)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is Literal:
        if value not in get_args(tp):
            allowed = ", ".join(repr(a) for a in get_args(tp))
            raise ConfigError(f"config key {path!r} must be one of {allowed}, not {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"config key {path!r} must be a list, not {_type(value)}")
        (item,) = get_args(tp)
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {path!r} must be true or false, not {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {path!r} must be an integer, not {_type(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {path!r} must be a number, not {_type(value)}")
        return float(value)
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(f"config key {path!r} must be a string, not {_type(value)}")
        return value
    raise ConfigError(f"config key {path!r} has an unsupported type")  # pragma: no cover


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__

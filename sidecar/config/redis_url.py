"""The Redis URL grammar (`redis://`, `rediss://`, `redis+cluster://`, sentinel and unix
forms): checked when the config is loaded, used by `sidecar.services.redis_client`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from redis.asyncio.connection import parse_url

Topology = Literal["redis", "cluster", "sentinel"]


SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": ("redis", False),
    "rediss": ("redis", True),
    "unix": ("redis", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}


FORMS = (
    "redis://H:P[/DB], rediss://…, redis+cluster://H:P[,H:P…], "
    "redis+sentinel://H:P[,H:P…]/SERVICE[/DB] or rediss+… for TLS"
)


DEFAULT_PORT = {"redis": 6379, "cluster": 6379, "sentinel": 26379}


# Connection options a URL may carry (any other would reach the client's constructor
# unchecked, and fail at the first call); the ssl_ ones only with TLS (rediss…).
_SSL_OPTIONS = frozenset(
    {
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
        "ssl_min_version",
    }
)


_OPTIONS = _SSL_OPTIONS | {
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "health_check_interval",
    "max_connections",
    "protocol",
    "client_name",
}


_HOST = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>.*))?$")


_SERVICE = re.compile(r"^[A-Za-z0-9._-]+$")


class RedisUrlError(ValueError):
    """A ledger or global-tier URL that cannot be used; the message never holds the
    password (nor the rest of the URL: it says what is wrong)."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed URL: the topology, its nodes (startup nodes or sentinels), TLS, the
    Sentinel service and database, and the client options (password included)."""

    topology: Topology
    tls: bool
    nodes: tuple[tuple[str, int], ...]
    url: str
    service: str = ""
    db: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        return self.url.partition("://")[0].lower()


def parse_redis_url(url: str) -> RedisTarget:
    """Check a URL of any form above; RedisUrlError says what is wrong."""
    scheme, sep, rest = url.partition("://")
    form = SCHEMES.get(scheme.lower()) if sep else None
    if form is None:
        raise RedisUrlError(f"the URL scheme {scheme if sep else ''!r} is not one of {FORMS}")
    topology, tls = form
    if scheme.lower() == "unix":
        return _parse_unix(url)
    if "#" in rest:
        raise RedisUrlError("a Redis URL has no #fragment")
    authority, path, query = _split(rest)
    userinfo, at, hosts = authority.rpartition("@")
    if not at:
        userinfo = ""
    nodes = tuple(_node(h, DEFAULT_PORT[topology]) for h in hosts.split(","))
    if topology == "redis" and len(nodes) != 1:
        raise RedisUrlError(
            f"{scheme}:// names one server; several are redis+cluster:// or redis+sentinel://"
        )
    parts = [p for p in path.split("/")[1:]] if path else []
    if parts and parts[-1] == "":
        parts.pop()  # a trailing slash
    service, db = "", 0
    if topology == "sentinel":
        if not parts or not _SERVICE.match(parts[0]):
            raise RedisUrlError(
                "a redis+sentinel:// URL names its master's service after the hosts "
                "(redis+sentinel://H:P,H:P/SERVICE[/DB])"
            )
        service, parts = parts[0], parts[1:]
    if len(parts) > 1 or (parts and not parts[0].isdigit()):
        raise RedisUrlError("the path of a Redis URL is at most a database number (/DB)")
    if parts:
        db = int(parts[0])
    if topology == "cluster" and db != 0:
        raise RedisUrlError("a Redis Cluster has database 0 only (redis+cluster://H:P[,H:P…])")
    given = set(parse_qs(query))
    unknown = sorted(given - (_OPTIONS | {"db"} if topology == "redis" else _OPTIONS))
    if unknown:
        raise RedisUrlError(f"unknown Redis URL option(s): {', '.join(unknown)}")
    if not tls and given & _SSL_OPTIONS:
        raise RedisUrlError(
            "ssl_… options need TLS (rediss://, rediss+cluster://, rediss+sentinel://)"
        )
    host, port = nodes[0]
    shown_host = f"[{host}]" if ":" in host else host
    base = "rediss" if tls else "redis"
    try:
        options = dict(
            parse_url(f"{base}://{userinfo}{at}{shown_host}:{port}/{db}?{query}")
        )  # redis-py's own reading of credentials and options
    except ValueError as exc:
        raise RedisUrlError(_safe(str(exc), userinfo)) from None
    for key in ("host", "port", "db", "connection_class", "path"):
        options.pop(key, None)
    return RedisTarget(topology, tls, nodes, url, service, db, options)


def _parse_unix(url: str) -> RedisTarget:
    parts = urlsplit(url)
    if not parts.path:
        raise RedisUrlError("a unix:// Redis URL names its socket (unix:///path/redis.sock)")
    return RedisTarget("redis", False, (), url)


def _split(rest: str) -> tuple[str, str, str]:
    """authority, path, query of what follows `scheme://`."""
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    path, _, query = tail.partition("?")
    return authority, path, query


def _node(text: str, default_port: int) -> tuple[str, int]:
    m = _HOST.match(text)
    if m is None:
        raise RedisUrlError("each host of a Redis URL is HOST:PORT (a name, an IPv4 or [IPv6])")
    port = m["port"]
    if port is None or port == "":
        if port == "":
            raise RedisUrlError("a Redis URL has an empty port")
        return m["v6"] or m["name"], default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisUrlError("a port of a Redis URL must be a number from 1 to 65535")
    return m["v6"] or m["name"], int(port)


def _safe(message: str, userinfo: str) -> str:
    return message.replace(userinfo, "***") if userinfo else message

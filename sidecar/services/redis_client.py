"""Redis connections of the quota ledger and the global rate-limit tier (DESIGN §7, §11, §12).

Owns the URL forms and what each becomes, always one of redis-py's asyncio clients:

  redis://[:PW@]H:P[/DB], rediss://…, unix:///path  one server (`Redis.from_url`)
  redis+cluster://[:PW@]H:P[,H:P…]                  `RedisCluster` with these startup
                                                    nodes (database 0 only)
  redis+sentinel://[:PW@]H:P[,H:P…]/SERVICE[/DB]    `Sentinel(H:P…).master_for(SERVICE)`
  rediss+cluster://…, rediss+sentinel://…           the same over TLS (to the
                                                    sentinels too)

A password in the URL is the data nodes' (`AUTH`); sentinels are asked without one.
Query parameters are redis-py's connection options (`?ssl_ca_certs=…`). The clients
follow MOVED/ASK redirects and a failover on their own; what fails while a master is
away raises one of `ERRORS` (a cluster that cannot be reached raises
`RedisClusterException`, which is not a `RedisError`).

Also here: the hash-tag rule (`tenant_key`: every key of one tenant carries `{tenant}`,
so a Lua script over them runs on one cluster slot), a SCAN over every master
(`RedisHandle.scan`), the `/readyz` words for a topology's state (`RedisHandle.state`),
and how long a call may try (a cluster retries twice, briefly; a sentinel that does not
answer is skipped at once), so that a call fails within about a second while a master
is away instead of waiting the failover out. Nothing that leaves this module
(`RedisUrlError`, `state`, `name`, `error_text`) names the password.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from sidecar.config.redis_url import RedisTarget, parse_redis_url
from sidecar.core.redact import redact_text

# What a Redis call raises when the server, the cluster or the sentinels fail.
ERRORS: tuple[type[BaseException], ...] = (
    RedisError,
    RedisClusterException,
    OSError,
    asyncio.TimeoutError,
)
ERROR_TEXT_MAX = 400
CLUSTER_RETRIES = 2
CLUSTER_BACKOFF_CAP = 0.2  # seconds


def error_text(exc: BaseException) -> str:
    """An error of a Redis call for the log: its type and message, the password of any
    URL in it masked, cut to ERROR_TEXT_MAX characters (a Sentinel error quotes every
    sentinel's client at length)."""
    text = redact_text(f"{type(exc).__name__}: {exc}")
    return text if len(text) <= ERROR_TEXT_MAX else text[: ERROR_TEXT_MAX - 1] + "…"


def tenant_key(prefix: str, tenant: str, suffix: str) -> str:
    """`{prefix}{tenant}:suffix`: the tenant is the hash tag, so every key of one tenant
    is in one cluster slot (the prefix holds no brace: config.py refuses one)."""
    return f"{prefix}{{{tenant}}}:{suffix}"


@dataclass
class RedisHandle:
    """The client of one URL (`client`), and what the topology needs besides: the
    Sentinel that names the master, for `/readyz`."""

    target: RedisTarget
    client: Any  # aioredis.Redis | RedisCluster
    sentinel: Sentinel | None = None
    initialized: bool = False

    async def initialize(self) -> None:
        """Before the first call: a cluster client learns the cluster's nodes once, by
        itself (redis-py's cluster client, learning them from a burst of first calls at
        once, hands some of them a connection it has just closed: AttributeError)."""
        if not self.initialized:
            if isinstance(self.client, RedisCluster):
                await self.client.initialize()  # single-flight inside redis-py
            self.initialized = True

    @property
    def name(self) -> str:
        """The topology in words (no password): `redis+cluster`, `redis+sentinel
        mymaster`, `redis 127.0.0.1:6379`."""
        t = self.target
        if t.topology == "sentinel":
            return f"{t.scheme} {t.service}"
        if t.topology == "cluster":
            return t.scheme
        if not t.nodes:
            return "redis (unix socket)"
        host, port = t.nodes[0]
        return f"{t.scheme} {host}:{port}"

    async def state(self) -> tuple[bool, str]:
        """(every master answers, what `/readyz` says about it): `3 masters ok`,
        `master 127.0.0.1:6390 ok`, `2 of 3 masters reachable`, `unreachable (…)`."""
        try:
            if isinstance(self.client, RedisCluster):
                return await self._cluster_state(self.client)
            if self.sentinel is not None:
                return await self._sentinel_state(self.sentinel)
            await self.client.ping()
            return True, "reachable"
        except ERRORS as exc:
            return False, f"unreachable ({type(exc).__name__})"

    async def _cluster_state(self, client: RedisCluster) -> tuple[bool, str]:
        await self.initialize()
        up, total = await _ping_primaries(client)
        if up < total:  # its map of the cluster may be old: a replica may have taken over
            await client.nodes_manager.initialize()
            up, total = await _ping_primaries(client)
        if up == total:
            return True, f"{total} masters ok"
        return False, f"{up} of {total} masters reachable"

    async def _sentinel_state(self, sentinel: Sentinel) -> tuple[bool, str]:
        try:
            host, port = await sentinel.discover_master(self.target.service)
        except MasterNotFoundError:
            return False, "no master known to the sentinels (failing over, or none reachable)"
        try:
            await self.client.ping()
        except ERRORS as exc:
            return False, f"master {_address(host, port)} unreachable ({type(exc).__name__})"
        return True, f"master {_address(host, port)} ok"

    async def scan(self, match: str, count: int = 1000) -> AsyncIterator[str]:
        """Every key matching `match` on every master (each key once per master)."""
        await self.initialize()
        async for key in self.client.scan_iter(match=match, count=count):
            yield key.decode() if isinstance(key, bytes) else str(key)

    async def close(self) -> None:
        await self.client.aclose()
        if self.sentinel is not None:  # its clients of the sentinels
            for client in self.sentinel.sentinels:
                await client.aclose()


async def _ping_primaries(client: RedisCluster) -> tuple[int, int]:
    primaries = client.get_primaries()
    answers = await asyncio.gather(
        *(client.ping(target_nodes=node) for node in primaries), return_exceptions=True
    )
    return sum(1 for a in answers if a is True), len(primaries)


def _address(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def open_redis(
    url: str,
    *,
    timeout: float,
    decode_responses: bool = False,
) -> RedisHandle:
    """The client for `url` (no connection is made until the first call, so an
    unreachable Redis at start-up never stops the sidecar). RedisUrlError on a bad URL."""
    target = parse_redis_url(url)
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "decode_responses": decode_responses,
    }
    if target.topology == "redis":
        return RedisHandle(target, aioredis.from_url(url, **common))
    options = {**common, **target.options}  # the URL's own options win, as in from_url
    if target.topology == "cluster":
        client = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
            # a master that is away stops its own slots only (the other tenants go on)
            require_full_coverage=False,
            # a lost connection is tried again on a fresh map of the cluster, briefly: a
            # call never waits out a failover (redis-py's default: 10 tries, up to 1 s apart)
            retry=Retry(ExponentialBackoff(cap=CLUSTER_BACKOFF_CAP), CLUSTER_RETRIES),
            ssl=target.tls,
            **options,
        )
        return RedisHandle(target, client)
    sentinel_options = {
        k: v for k, v in options.items() if k.startswith(("socket_", "ssl_")) or k == "protocol"
    }
    # A sentinel that does not answer is skipped at once for the next one (the
    # default retries each ten times, seconds in all).
    sentinel_options["retry"] = Retry(NoBackoff(), 0)
    if target.tls:
        sentinel_options["ssl"] = True
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.nodes), sentinel_kwargs=sentinel_options
    )
    master = sentinel.master_for(target.service, db=target.db, ssl=target.tls, **options)
    return RedisHandle(target, master, sentinel)

"""The Redis URL forms of the ledger and the global tier (sidecar/services/redis_client.py):
what each becomes (redis-py's own clients), what a malformed one does to start-up (a
one-line message naming the config key, never the password), the hash-tag rule, and
the `/readyz` words for each real topology (the session's Redis Cluster and Sentinel
set, tests/rigs/redis_topologies.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection
from redis.crc import key_slot

from sidecar.config.redis_url import RedisUrlError, parse_redis_url
from sidecar.config.settings import ConfigError, load_config
from sidecar.services.redis_client import error_text, open_redis, tenant_key
from tests.rigs import processes
from tests.rigs.redis_topologies import RedisClusterRig, SentinelRig

SECRET = "hunter2-secret"


@pytest.mark.parametrize(
    ("url", "topology", "tls", "nodes", "service", "db"),
    [
        ("redis://127.0.0.1:6379/2", "redis", False, [("127.0.0.1", 6379)], "", 2),
        ("rediss://:pw@cache.local:6380", "redis", True, [("cache.local", 6380)], "", 0),
        (
            "redis+cluster://10.0.0.1:7000,10.0.0.2:7001,[::1]:7002",
            "cluster",
            False,
            [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002)],
            "",
            0,
        ),
        ("rediss+cluster://h1:7000/", "cluster", True, [("h1", 7000)], "", 0),
        (
            "redis+sentinel://:pw@s1:26379,s2/mymaster/3",
            "sentinel",
            False,
            [("s1", 26379), ("s2", 26379)],
            "mymaster",
            3,
        ),
        ("rediss+sentinel://s1:5000/cache", "sentinel", True, [("s1", 5000)], "cache", 0),
    ],
)
def test_each_url_form_names_its_topology(
    url: str, topology: str, tls: bool, nodes: list[tuple[str, int]], service: str, db: int
) -> None:
    t = parse_redis_url(url)
    assert (t.topology, t.tls, list(t.nodes), t.service, t.db) == (
        topology,
        tls,
        nodes,
        service,
        db,
    )


def test_credentials_and_options_are_redis_pys_reading() -> None:
    t = parse_redis_url(
        "rediss+cluster://ops:p%40ss@h1:7000,h2:7000?ssl_cert_reqs=none&socket_timeout=0.5"
    )
    assert t.options == {
        "username": "ops",
        "password": "p@ss",
        "ssl_cert_reqs": "none",
        "socket_timeout": 0.5,
    }


BAD_URLS = [
    f"redis+cluster://:{SECRET}@",  # no host
    f"redis+cluster://:{SECRET}@h:notaport",
    f"redis+cluster://:{SECRET}@h:70000",
    f"redis+cluster://:{SECRET}@h:",
    f"redis+cluster://:{SECRET}@h:1,,h:2",
    f"redis+cluster://:{SECRET}@h:1/3",  # a cluster has database 0 only
    f"redis+cluster://:{SECRET}@h:1?bogus=1",
    f"redis+cluster://:{SECRET}@h:1?ssl_ca_certs=/ca.pem",  # TLS options without TLS
    f"redis+cluster://:{SECRET}@h:1#frag",
    f"redis+sentinel://:{SECRET}@h:26379",  # no service
    f"redis+sentinel://:{SECRET}@h:26379/",
    f"redis+sentinel://:{SECRET}@h:26379/svc/x",
    f"redis+sentinel://:{SECRET}@h:26379/svc/0/extra",
    f"redis+sentinel://:{SECRET}@h:26379/svc?socket_timeout=soon",
    f"redis+clusterr://:{SECRET}@h:1",
    f"redis://:{SECRET}@h1:1,h2:2/0",  # several hosts need +cluster or +sentinel
    f"redis://:{SECRET}@h:1/x",  # redis-py would quietly use database 0
    f"redis://:{SECRET}@h:1/0?nonsense=1",
    f"h:1,{SECRET}",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(RedisUrlError) as info:
        parse_redis_url(url)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("url", BAD_URLS[:4] + BAD_URLS[9:11])
@pytest.mark.parametrize("key", ["ledger", "rateLimit.global"])
def test_config_names_the_key_of_a_malformed_url(url: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={key: url})
    assert f"'{key}'" in str(info.value)
    assert SECRET not in str(info.value)


def test_an_unknown_ledger_scheme_is_refused_without_its_password() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={"ledger": f"mysql://root:{SECRET}@db/quota"})
    assert "'ledger'" in str(info.value)
    assert "sqlite:///path" in str(info.value)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("key", ["quota.redisPrefix", "rateLimit.globalPrefix"])
def test_a_prefix_with_a_brace_is_refused(key: str) -> None:
    # `{` in the prefix would make it the hash tag: every tenant on one cluster slot,
    # or (`x{}`) each key of one tenant on a slot of its own.
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={key: "app{}:"})
    assert f"'{key}'" in str(info.value)


def test_every_url_form_is_accepted_by_the_config() -> None:
    config = load_config(
        env={},
        overrides={
            "ledger": "redis+sentinel://:pw@s1:26379,s2:26379/mymaster/0",
            "rateLimit.global": "rediss+cluster://h1:7000,h2:7000",
        },
    )
    assert config.ledger.startswith("redis+sentinel://")


def test_a_malformed_url_stops_start_up_in_one_line(tmp_path: Path) -> None:
    config = processes.write_config(
        tmp_path,
        {
            "ledger": f"redis+sentinel://:{SECRET}@127.0.0.1:26379",
            "policies": str(tmp_path),
            "listen": f"127.0.0.1:{processes.free_port()}",
        },
    )
    result = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "'ledger'" in result.stderr
    assert "SERVICE" in result.stderr  # it says what is missing
    assert SECRET not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_each_form_becomes_redis_pys_own_client() -> None:
    plain = open_redis("redis://127.0.0.1:6379/1", timeout=1)
    cluster = open_redis("rediss+cluster://:pw@10.9.9.1:7000,10.9.9.2:7001", timeout=1)
    sentinel = open_redis("rediss+sentinel://:pw@10.9.9.1:26379,10.9.9.2/cache/2", timeout=1)
    try:
        assert isinstance(plain.client, aioredis.Redis)
        assert plain.client.connection_pool.connection_kwargs["db"] == 1

        assert isinstance(cluster.client, RedisCluster)
        assert sorted(cluster.client.nodes_manager.startup_nodes) == [
            "10.9.9.1:7000",
            "10.9.9.2:7001",
        ]
        kwargs: dict[str, Any] = cluster.client.nodes_manager.connection_kwargs
        assert kwargs["password"] == "pw"
        assert kwargs["connection_class"] is SSLConnection

        pool = sentinel.client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert pool.service_name == "cache"
        assert pool.connection_class is SentinelManagedSSLConnection
        assert pool.connection_kwargs["password"] == "pw"
        assert pool.connection_kwargs["db"] == 2
        assert sentinel.sentinel is not None
        pools = [s.connection_pool for s in sentinel.sentinel.sentinels]
        asked = [(p.connection_kwargs["host"], p.connection_kwargs["port"]) for p in pools]
        assert asked == [("10.9.9.1", 26379), ("10.9.9.2", 26379)]
        assert all(p.connection_kwargs.get("password") is None for p in pools)  # no AUTH
        assert all(p.connection_class is SSLConnection for p in pools)
    finally:
        for handle in (plain, cluster, sentinel):
            await handle.close()


def test_every_key_of_a_tenant_is_in_one_slot() -> None:
    for tenant in ("acme", "beta", "t-1", "a" * 63):
        slots = {
            key_slot(tenant_key("sidecar:quota:", tenant, s).encode())
            for s in ("used", "inprog", "res", "resexp", "objs", "limits", "tomb", "claims")
        }
        slots |= {key_slot(tenant_key("sidecar:rl:", tenant, s).encode()) for s in ("all", "u:x")}
        assert slots == {key_slot(tenant.encode())}


def test_error_text_is_short_and_masks_passwords() -> None:
    text = error_text(ValueError(f"cannot reach redis://:{SECRET}@h:1 " + "x" * 2000))
    assert SECRET not in text
    assert len(text) <= 400


async def test_readyz_words_for_the_cluster(redis_cluster: RedisClusterRig) -> None:
    handle = open_redis(redis_cluster.url, timeout=1)
    try:
        assert handle.name == "redis+cluster"
        assert await handle.state() == (True, "3 masters ok")
    finally:
        await handle.close()


async def test_readyz_words_for_the_sentinel_set(redis_sentinel: SentinelRig) -> None:
    handle = open_redis(redis_sentinel.url, timeout=1)
    try:
        assert handle.name == "redis+sentinel mymaster"
        master = redis_sentinel.master()
        assert await handle.state() == (True, f"master 127.0.0.1:{master.port} ok")
    finally:
        await handle.close()


async def test_readyz_words_when_nothing_answers() -> None:
    dead = [processes.free_port() for _ in range(2)]
    hosts = ",".join(f"127.0.0.1:{p}" for p in dead)
    cluster = open_redis(f"redis+cluster://:{SECRET}@{hosts}", timeout=0.5)
    sentinel = open_redis(f"redis+sentinel://:{SECRET}@{hosts}/mymaster", timeout=0.5)
    plain = open_redis(f"redis://:{SECRET}@127.0.0.1:{dead[0]}/0", timeout=0.5)
    try:
        assert await cluster.state() == (False, "unreachable (RedisClusterException)")
        ok, words = await sentinel.state()
        assert (ok, words.split(" (")[0]) == (False, "no master known to the sentinels")
        assert await plain.state() == (False, "unreachable (ConnectionError)")
        assert plain.name == f"redis 127.0.0.1:{dead[0]}"
    finally:
        for handle in (cluster, sentinel, plain):
            await handle.close()

"""Real replicated Redis for tests: a six-node Redis Cluster (three masters with one
replica each) and a Sentinel set (a master and a replica that require a password, and
three sentinels).

Every `redis-server` runs from its own temp directory on a loopback port below 22700
(a cluster node's bus port is its port + 10000, so both must be free), logs into that
directory and is stopped by its PID. A port picked free can be taken before the child
binds it: a node that exits at start-up with "Address already in use" is started again
on newly picked ports. Failover is fast on purpose (`cluster-node-timeout` and
`down-after-milliseconds` of one second), so a test can kill the master that holds a
tenant and see a replica take over within seconds; `heal()` starts the killed node
again (it rejoins as a replica) and waits until the topology is whole.

The fixtures (`redis_cluster`, `redis_sentinel` in tests/conftest.py) start each once
per session (about 2 s each); under CI=true a missing `redis-server` fails instead of
skipping.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from tests.rigs.waiting import eventually_sync

# Below Linux's ephemeral ports (32768+), bus ports (+ 10000) included: an outgoing
# connection cannot take the port of a node that is killed and started again.
PORT_RANGE = (12000, 22700)
BIND_ATTEMPTS = 8
FAILOVER_MS = 1000  # cluster-node-timeout, down-after-milliseconds
SERVICE = "mymaster"
SENTINEL_PASSWORD = "s3ntinel-data-pw"  # the data nodes'; the sentinels need none
_IN_USE = "address already in use"
_COMMON = [
    *("--bind", "127.0.0.1", "--protected-mode", "no", "--save", "", "--appendonly", "no"),
    # a replica syncs at once (the default waits 5 s for more replicas to come)
    *("--repl-diskless-sync-delay", "0"),
]


class RedisUnavailable(RuntimeError):
    """No `redis-server` / `redis-cli` binary on this machine."""


def binaries() -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not server or not cli:
        raise RedisUnavailable("redis-server and redis-cli are needed for the Redis topologies")
    return server, cli


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(bus: bool) -> int:
    """A free loopback port (and its bus port + 10000 free too, for a cluster node)."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(*PORT_RANGE)
        if _free(port) and (not bus or _free(port + 10000)):
            return port
    raise RuntimeError("no free port pair found")


@dataclass
class Node:
    """One redis-server (data node or sentinel) in its own directory."""

    name: str
    dir: Path
    args: list[str]  # after the binary and before `--port`
    bus: bool = False  # a cluster node: its bus port must be free as well
    password: str | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / "redis.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(
            port=self.port,
            password=self.password,
            socket_timeout=1,
            socket_connect_timeout=1,
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),  # one answer or none (the default tries 11 times)
        )

    def call(self, *command: str) -> Any:
        """One command on this node alone."""
        client = self.client()
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def answers(self) -> bool:
        try:
            return bool(self.call("PING"))
        except (redis.RedisError, OSError):
            return False

    def replication(self) -> dict[str, Any]:
        client = self.client()
        try:
            info = client.info("replication")
            assert isinstance(info, dict)
            return info
        finally:
            client.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, same_port: bool = False) -> None:
        """Start it on new free ports, again while a port turns out taken; with
        `same_port` (a node that comes back) on its old port first. A cluster node that
        comes back on another port keeps its identity (nodes.conf) and tells the others."""
        server, _ = binaries()
        self.dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(BIND_ATTEMPTS):
            if attempt > 0 or not same_port:
                self.port = pick_port(self.bus)
            self.log.write_text("")
            self.proc = subprocess.Popen(
                [server, *self.args, "--port", str(self.port), "--logfile", str(self.log)],
                cwd=str(self.dir),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

            def up() -> bool:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
                return self.answers()

            try:
                eventually_sync(up, 10, what=f"{self.name} answers on {self.port}")
                return
            except RuntimeError:
                if _IN_USE not in self.log.read_text().lower() or attempt == BIND_ATTEMPTS - 1:
                    raise
        raise RuntimeError(f"{self.name} did not start")

    def kill(self) -> None:
        """SIGKILL, as a crashed server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def delete(self, prefix: str) -> None:
        """Delete `prefix*` here, if this is a live master (a replica follows it)."""
        if not self.alive():
            return
        client = self.client()
        try:
            if client.info("replication")["role"] != "master":
                return
            for key in list(client.scan_iter(match=f"{prefix}*", count=1000)):
                client.delete(key)  # one by one: keys of a cluster node span slots
        except (redis.RedisError, OSError):
            pass  # a node that is away: its keys go with the session's servers
        finally:
            client.close()


@dataclass
class RedisClusterRig:
    """Six cluster nodes; `url` is the `redis+cluster://` URL of all of them."""

    root: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(n.address for n in self.nodes)

    def start(self) -> None:
        _, cli = binaries()
        args = [
            *_COMMON,
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", str(FAILOVER_MS)),
            # any replica may take over, however long its master was away
            *("--cluster-replica-validity-factor", "0"),
            # a dead master stops its own slots only, not every tenant's
            *("--cluster-require-full-coverage", "no"),
        ]
        self.nodes = [
            Node(f"cluster-{i}", self.root / f"node-{i}", args, bus=True) for i in range(6)
        ]
        for n in self.nodes:
            n.start()
        done = subprocess.run(
            [
                *(cli, "--cluster", "create", *(n.address for n in self.nodes)),
                *("--cluster-replicas", "1", "--cluster-yes"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        self.wait_whole()

    def wait_whole(self, within: float = 30.0) -> None:
        """Until every node says the cluster is ok, knows six connected nodes, three
        masters hold all slots and every replica is in sync with its master."""

        def whole() -> bool:
            try:
                for n in self.nodes:
                    info = str(n.call("CLUSTER", "INFO"))
                    if "cluster_state:ok" not in info or "cluster_known_nodes:6" not in info:
                        return False
                    flags = [
                        line.split()[2] for line in str(n.call("CLUSTER", "NODES")).splitlines()
                    ]
                    if any("fail" in f for f in flags) or sum("master" in f for f in flags) != 3:
                        return False
                for n in self.nodes:
                    rep = n.replication()
                    if rep["role"] == "slave" and rep.get("master_link_status") != "up":
                        return False
                return True
            except (redis.RedisError, OSError):
                return False

        eventually_sync(whole, within, what="the Redis Cluster is whole")

    def master_of(self, key: str) -> Node:
        """The node that masters `key`'s slot now, as the live nodes see it."""
        alive = [n for n in self.nodes if n.alive()]
        client = RedisCluster(
            startup_nodes=[
                ClusterNode("127.0.0.1", n.port)  # type: ignore[no-untyped-call]
                for n in alive
            ],
            socket_timeout=1,
            socket_connect_timeout=1,
        )
        try:
            slot = client.keyslot(key)  # type: ignore[no-untyped-call]
            port = int(client.nodes_manager.get_node_from_slot(slot).port)
        finally:
            client.close()
        return next(n for n in self.nodes if n.port == port)

    def kill_master_of(self, key: str) -> Node:
        """SIGKILL the master holding `key`'s slot; the cluster promotes its replica."""
        victim = self.master_of(key)
        victim.kill()
        return victim

    def promoted(self, key: str, victim: Node) -> bool:
        """A live node other than `victim` now masters `key`'s slot."""
        try:
            return self.master_of(key) is not victim
        except (redis.RedisError, redis.exceptions.RedisClusterException, StopIteration):
            return False

    def heal(self, victim: Node) -> None:
        """Start a killed node again (it rejoins as a replica) and wait for a whole cluster."""
        if not victim.alive():
            victim.start(same_port=True)
        self.wait_whole()

    def delete(self, prefix: str) -> None:
        """Delete the keys under `prefix` on every master (a test's own keys)."""
        for n in self.nodes:
            n.delete(prefix)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


@dataclass
class SentinelRig:
    """A master and its replica (both requiring SENTINEL_PASSWORD) and three sentinels
    watching them as `mymaster`; `url` carries the password, as an operator's would."""

    root: Path
    data: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(s.address for s in self.sentinels)
        return f"redis+sentinel://:{SENTINEL_PASSWORD}@{hosts}/{SERVICE}"

    def _data_args(self, master_port: int | None) -> list[str]:
        auth = ["--requirepass", SENTINEL_PASSWORD, "--masterauth", SENTINEL_PASSWORD]
        follow = ["--replicaof", "127.0.0.1", str(master_port)] if master_port else []
        return [*_COMMON, *auth, *follow]

    def start(self) -> None:
        master = Node("sentinel-master", self.root / "master", self._data_args(None))
        master.password = SENTINEL_PASSWORD
        master.start()
        replica = Node("sentinel-replica", self.root / "replica", self._data_args(master.port))
        replica.password = SENTINEL_PASSWORD
        replica.start()
        self.data = [master, replica]
        for i in range(3):
            d = self.root / f"sentinel-{i}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"
            conf.write_text(
                "bind 127.0.0.1\n"
                "protected-mode no\n"
                f"dir {d}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
                f"sentinel auth-pass {SERVICE} {SENTINEL_PASSWORD}\n"
                f"sentinel down-after-milliseconds {SERVICE} {FAILOVER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 3000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            s = Node(f"sentinel-{i}", d, [str(conf), "--sentinel"])
            s.start()
            self.sentinels.append(s)
        self.wait_whole()

    def _states(self) -> list[dict[str, Any] | None]:
        """What each sentinel knows of `mymaster` (None: nothing)."""
        states: list[dict[str, Any] | None] = []
        for s in self.sentinels:
            client = s.client()
            try:
                masters = client.sentinel_masters()
            finally:
                client.close()
            assert isinstance(masters, dict)
            states.append(masters.get(SERVICE))
        return states

    def master(self) -> Node:
        """The data node the sentinels name as master now."""
        for state in self._states():
            if state:
                port = int(state["port"])
                return next(n for n in self.data if n.port == port)
        raise RuntimeError("no sentinel names a master")

    def wait_whole(self, within: float = 30.0) -> None:
        """Until every sentinel sees the master up, the two other sentinels and a
        replica, and that replica is in sync (what a failover needs)."""

        def whole() -> bool:
            try:
                states = self._states()
                master = self.master()
                replicas = [n for n in self.data if n is not master]
                reps = [n.replication() for n in replicas]
            except (redis.RedisError, OSError, RuntimeError):
                return False
            return all(
                st
                and not st.get("is_sdown")
                and not st.get("is_odown")
                and int(st["port"]) == master.port
                and int(st["num-other-sentinels"]) == 2
                and int(st["num-slaves"]) >= 1
                for st in states
            ) and all(
                r["role"] == "slave"
                and r.get("master_link_status") == "up"
                and int(r.get("master_port", 0)) == master.port
                for r in reps
            )

        eventually_sync(whole, within, what="the Sentinel set is whole")

    def kill_master(self) -> Node:
        victim = self.master()
        victim.kill()
        return victim

    def promoted(self, victim: Node) -> bool:
        try:
            return self.master() is not victim
        except (redis.RedisError, OSError, RuntimeError):
            return False

    def heal(self, victim: Node) -> None:
        """Start the old master again, as a replica of the new one (what the sentinels
        would make it, but their view of replicas refreshes only every 10 s), and wait
        until it is in sync and every sentinel names the new master."""
        master = self.master()
        if not victim.alive():
            victim.args = self._data_args(master.port)
            victim.start(same_port=True)

        def synced() -> bool:
            try:
                rep = victim.replication()
                states = self._states()
            except (redis.RedisError, OSError):
                return False
            return (
                rep["role"] == "slave"
                and rep.get("master_link_status") == "up"
                and all(
                    st and not st.get("is_sdown") and int(st["port"]) == master.port
                    for st in states
                )
            )

        eventually_sync(synced, 30, what=f"{victim.name} replicates the new master")

    def delete(self, prefix: str) -> None:
        """Delete the keys under `prefix` (a test's own keys)."""
        for n in self.data:
            n.delete(prefix)

    def stop(self) -> None:
        for n in [*self.sentinels, *self.data]:
            n.stop()


Topology = RedisClusterRig | SentinelRig


def start(rig: Topology) -> None:
    """Start every node of `rig`; on a failure, stop those already running."""
    try:
        rig.start()
    except BaseException:
        rig.stop()
        raise

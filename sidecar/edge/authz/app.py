"""The decision service's part of the composition root (DESIGN §13): built by
`sidecar.app.build_app` from the proxy's own services and stages when `authz.listen` or
`authz.grpcListen` is set, and served by `sidecar serve` (`sidecar/cli/main.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from sidecar.edge.authz.decider import Decider
from sidecar.edge.authz.fastserver import Handler
from sidecar.edge.authz.kubernetes import KubernetesWebhook
from sidecar.edge.authz.listener import build_handler
from sidecar.edge.authz.marker import Marker

if TYPE_CHECKING:
    from sidecar.config.settings import Config
    from sidecar.pipeline.authorize import Authorizer
    from sidecar.pipeline.chain import Stage
    from sidecar.pipeline.identity import IdentityStage
    from sidecar.policy.source.store import PolicyStore
    from sidecar.services.identity.credentials import CredentialWatcher
    from sidecar.services.metrics import Metrics


@dataclass(frozen=True)
class Authz:
    """What `sidecar serve` serves on `authz.listen` / `authz.grpcListen`."""

    decider: Decider
    handler: Handler


AUTHZ_KEY = web.AppKey("authz", Authz)


def authz_marker(config: Config) -> Marker | None:
    """The marker of this process tree, when the decision service is on."""
    if config.authz.listen is None and config.authz.grpc_listen is None:
        return None
    return Marker(config.authz.marker_ttl_seconds)


def build_authz(
    config: Config,
    policy: PolicyStore,
    stages: Sequence[Stage],
    authorizer: Authorizer,
    identity: IdentityStage,
    credentials: CredentialWatcher,
    metrics: Metrics,
    marker: Marker,
) -> Authz:
    decider = Decider(config, policy, stages, authorizer, identity, credentials, metrics, marker)
    webhook = KubernetesWebhook(
        policy,
        {s.name: s for s in stages},
        authorizer.authorize,
        config.limits.max_body_bytes,
    )
    return Authz(decider, build_handler(decider, webhook))


__all__ = ["AUTHZ_KEY", "Authz", "authz_marker", "build_authz"]

"""The decision listener (`authz.listen`, DESIGN §13): the three question shapes and
`/healthz`, nothing else; never a proxy. Served by `sidecar serve` in the proxy's own
processes, so it decides with the proxy's policy, credentials, caches, buckets,
metrics and audit. It trusts the `X-Original-*` headers it is given: bind it to
loopback, never expose it to clients.

Any question it cannot read is a 400 Status, never an allow.
"""

from __future__ import annotations

import logging

from aiohttp import web

from sidecar.core.status import StatusError
from sidecar.edge.authz import envoy_http, nginx
from sidecar.edge.authz.decider import Decider
from sidecar.edge.authz.kubernetes import PATH as KUBERNETES
from sidecar.edge.authz.kubernetes import KubernetesWebhook
from sidecar.edge.authz.kubernetes import handler as kubernetes_handler
from sidecar.edge.server import Route
from sidecar.wire.status import response as status_response

log = logging.getLogger("sidecar.authz")

_HEALTHY = b"ok"


def build_handler(decider: Decider, webhook: KubernetesWebhook) -> Route:
    envoy = envoy_http.handler(decider)
    ngx = nginx.handler(decider)
    sar = kubernetes_handler(webhook)
    envoy_prefix = envoy_http.PREFIX

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = request.raw_path
        try:
            if raw.startswith(envoy_prefix):
                return await envoy(request)
            path = raw.partition("?")[0]
            if path in (nginx.PREFIX, nginx.DENIED):
                return await ngx(request)
            if path == KUBERNETES:
                return await sar(request)
            if path == "/healthz":
                return web.Response(body=_HEALTHY, content_type="text/plain")
            raise StatusError(404, "the decision listener answers /envoy, /nginx and /kubernetes")
        except StatusError as exc:
            return status_response(exc)
        except Exception:
            log.exception("decision listener: internal error")
            return status_response(StatusError(500, "internal error in the decider"))

    return handle


__all__ = ["build_handler"]

"""The decision listener (`authz.listen`, DESIGN §13): the three question shapes and
`/healthz`, nothing else; never a proxy. Served by `sidecar serve` in the proxy's own
processes (`fastserver.py`), so it decides with the proxy's policy, credentials,
caches, buckets, metrics and audit. It trusts the `X-Original-*` headers it is given:
bind it to loopback, never expose it to clients.

Any question it cannot read is a 400 Status, never an allow.
"""

from __future__ import annotations

import logging

from sidecar.core.status import StatusError
from sidecar.edge.authz import envoy_http, nginx
from sidecar.edge.authz.answers import error_bytes
from sidecar.edge.authz.decider import Decider
from sidecar.edge.authz.fastserver import Handler, Question, encode
from sidecar.edge.authz.kubernetes import PATH as KUBERNETES
from sidecar.edge.authz.kubernetes import KubernetesWebhook
from sidecar.edge.authz.kubernetes import handler as kubernetes_handler

log = logging.getLogger("sidecar.authz")

_HEALTHY = encode(200, [("content-type", "text/plain")], b"ok")


def build_handler(decider: Decider, webhook: KubernetesWebhook) -> Handler:
    envoy = envoy_http.handler(decider)
    ngx = nginx.handler(decider)
    sar = kubernetes_handler(webhook)
    envoy_prefix = envoy_http.PREFIX

    async def handle(question: Question) -> bytes:
        raw = question.target
        try:
            if raw.startswith(envoy_prefix):
                return await envoy(question)
            path = raw.partition("?")[0]
            if path in (nginx.PREFIX, nginx.DENIED):
                return await ngx(question)
            if path == KUBERNETES:
                return await sar(question)
            if path == "/healthz":
                return _HEALTHY
            raise StatusError(404, "the decision listener answers /envoy, /nginx and /kubernetes")
        except StatusError as exc:
            return error_bytes(exc)

    return handle


__all__ = ["build_handler"]

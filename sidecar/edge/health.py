"""The sidecar's own endpoints: `/healthz`, `/readyz` and `/metrics` (DESIGN §9).

`/healthz` and `/readyz` need no credentials, never pass the rate limiter and are
never forwarded. `/readyz` runs the checks registered with `Readiness.add` (in
`app.py`, explicitly): it is 503 only when a `required` check fails (no policy,
upstream unreachable); any other failing check (the quota ledger, the global
rate-limit tier, the audit writer, a credential file) shows in the details and keeps
it 200. Details never carry a password or a file path (`public_detail`), and the
checks run at most once per `READY_CACHE_SECONDS` however often anonymous clients ask,
so probing `/readyz` cannot load the upstream, Redis or the ledger.

`/readyz` answers within a second whatever a dependency does (DESIGN §9): the checks
run concurrently, and one without an answer after `CHECK_SECONDS` counts as failed. It
is not cancelled (a probe cut mid-way could leave a connection or a thread in any
state): it runs on, and the next evaluation waits for that same probe instead of
starting another, so a stalled dependency never piles probes up. From SIGTERM on
(`shutting_down`) `/readyz` answers 503 at once, while the listener still serves
requests for `shutdownDrainSeconds`, so load balancers stop sending new ones first.

`/metrics` names tenants: on the main listener its route goes through the pipeline
like any non-resource URL and `metrics_handler` answers it once authorization has
allowed it; the optional `metricsListen` address serves it without credentials
(`build_metrics_app`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from sidecar.core.redact import public_detail
from sidecar.core.status import StatusError, forbidden
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.services.metrics import Metrics
from sidecar.wire.status import response as status_response

log = logging.getLogger("sidecar")

METRICS_PATH = "/metrics"
READY_CACHE_SECONDS = 0.5
# A check's budget: /readyz answers within a second (with room for the loop's own work).
CHECK_SECONDS = 0.75

# A readiness probe: (ok, detail). The detail is shown on /readyz after redaction.
Probe = Callable[[], Awaitable[tuple[bool, str]]]


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    name: str
    probe: Probe
    # Without it the sidecar cannot serve any request: a failure makes /readyz 503.
    required: bool


class Readiness:
    """The registered checks, run single-flight, reusing a fresh result."""

    def __init__(self, metrics: Metrics, check_seconds: float = CHECK_SECONDS) -> None:
        self.metrics = metrics
        self.check_seconds = check_seconds
        self.checks: list[ReadyCheck] = []
        self._result: tuple[float, int, bytes] | None = None
        self._running: asyncio.Task[tuple[int, bytes]] | None = None
        # Each check's probe while it runs (one at a time per check, see the docstring).
        self._probes: dict[str, asyncio.Future[tuple[bool, str]]] = {}
        self._shutting_down = False
        # Each check's outcome at the last evaluation (sidecar/edge/ops_metrics.py).
        self.last: dict[str, bool] = {}

    def add(self, name: str, probe: Probe, *, required: bool = False) -> None:
        if any(c.name == name for c in self.checks):
            raise ValueError(f"readiness check {name!r} registered twice")
        self.checks.append(ReadyCheck(name, probe, required))

    def shutting_down(self) -> None:
        """SIGTERM: from now on /readyz is 503, whatever the checks say."""
        self._shutting_down = True

    async def response(self) -> web.Response:
        if self._shutting_down:
            status, body = 503, _SHUTTING_DOWN
        else:
            status, body = await self._get()
        return web.Response(status=status, body=body, content_type="application/json")

    async def run_check(self, name: str) -> bool | None:
        """Run one check (sharing a probe still running) within its budget, as `/readyz`
        would, and record its outcome (`last`, `sidecar_ready_check`); None when no
        check has that name (sidecar/edge/ops_metrics.py: the ledger's state)."""
        check = next((c for c in self.checks if c.name == name), None)
        if check is None:
            return None
        probe = self._probe(check)
        await asyncio.wait([probe], timeout=self.check_seconds)
        ok, _ = self._outcome(check, probe)
        self.metrics.ready_check.labels(name).set(1 if ok else 0)
        self.last = {**self.last, name: ok}
        return ok

    async def _get(self) -> tuple[int, bytes]:
        cached = self._result
        if cached is not None and time.monotonic() - cached[0] < READY_CACHE_SECONDS:
            return cached[1], cached[2]
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._evaluate())
        # shield: one client going away does not cancel the probe the others await.
        return await asyncio.shield(self._running)

    def _probe(self, check: ReadyCheck) -> asyncio.Future[tuple[bool, str]]:
        """The check's probe: the one still running from an earlier evaluation, else a
        new one."""
        running = self._probes.get(check.name)
        if running is not None and running.done() and not running.cancelled():
            running.exception()  # a late answer nobody waits for any more
        if running is None or running.done():
            running = self._probes[check.name] = asyncio.ensure_future(check.probe())
        return running

    def _outcome(
        self, check: ReadyCheck, probe: asyncio.Future[tuple[bool, str]]
    ) -> tuple[bool, str]:
        if not probe.done():
            return False, f"no answer within {self.check_seconds:g} s"
        self._probes.pop(check.name, None)
        exc = probe.exception()
        if exc is not None:  # a readiness probe must answer, whatever broke
            log.error("readiness check %s failed", check.name, exc_info=exc)
            return False, "the check failed (see the log)"
        return probe.result()

    async def _evaluate(self) -> tuple[int, bytes]:
        probes = {check.name: self._probe(check) for check in self.checks}
        if probes:
            await asyncio.wait(probes.values(), timeout=self.check_seconds)
        results = {check.name: self._outcome(check, probes[check.name]) for check in self.checks}
        required = {c.name for c in self.checks if c.required}
        checks = {
            name: {"ok": ok, "required": name in required, "detail": public_detail(detail)}
            for name, (ok, detail) in results.items()
        }
        for name, (ok, _) in results.items():
            self.metrics.ready_check.labels(name).set(1 if ok else 0)
        self.last = {name: ok for name, (ok, _) in results.items()}
        ready = all(ok for name, (ok, _) in results.items() if name in required)
        degraded = sorted(name for name, (ok, _) in results.items() if not ok)
        body = json.dumps({"ready": ready, "degraded": degraded, "checks": checks}).encode()
        status = 200 if ready else 503
        self._result = (time.monotonic(), status, body)
        return status, body


_SHUTTING_DOWN = json.dumps(
    {
        "ready": False,
        "degraded": ["shutdown"],
        "checks": {
            "shutdown": {
                "ok": False,
                "required": True,
                "detail": "shutting down: finishing requests, taking no new ones soon",
            }
        },
    }
).encode()


def _get_only(method: str, path: str) -> None:
    if method not in ("GET", "HEAD"):
        raise StatusError(405, f"{path} answers GET only", headers={"Allow": "GET, HEAD"})


def probe_handler(readiness: Readiness) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`/healthz` and `/readyz`: answered for every method, never forwarded."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            _get_only(request.method, request.path)
        except StatusError as exc:
            return status_response(exc)
        if request.path == "/healthz":
            return web.json_response({"status": "ok"})
        return await readiness.response()

    return handle


def metrics_response(metrics: Metrics, method: str) -> web.Response:
    _get_only(method, METRICS_PATH)
    return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")


def metrics_handler(metrics: Metrics) -> Handler:
    """The terminal of the `/metrics` route: answered only when authorization allowed
    it like any non-resource URL; never forwarded, whatever the method."""

    async def terminal(ctx: RequestContext) -> web.StreamResponse:
        # Dry-run lets a would-deny through to the upstream; never to the metrics,
        # which name every tenant (the same reason isolation is never dry-run).
        if ctx.decision is None or not ctx.decision.allowed:
            raise forbidden(
                f"{METRICS_PATH} needs a grant of nonResourceURLs "
                f"[{METRICS_PATH}], verb get (dry-run does not apply)"
            )
        return metrics_response(metrics, ctx.request.method)

    return terminal


def build_metrics_app(metrics: Metrics) -> web.Application:
    """The `metricsListen` listener: `/metrics` without credentials, nothing else."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            if request.path != METRICS_PATH:
                raise StatusError(404, f"this listener serves {METRICS_PATH} only")
            return metrics_response(metrics, request.method)
        except StatusError as exc:
            return status_response(exc)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app

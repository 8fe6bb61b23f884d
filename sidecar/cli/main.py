"""The `sidecar` command: serve, demo, and the `policy` and `quota` command groups."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sidecar.config.settings import Config, ConfigError, load_config

if TYPE_CHECKING:
    from sidecar.edge.health import Readiness
    from sidecar.edge.tls import TlsReloader

log = logging.getLogger("sidecar")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the sidecar")
    serve.add_argument("--config", help="YAML config file (default: built-in defaults)")
    serve.add_argument("--workers", type=int, help="processes sharing the port (SO_REUSEPORT)")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("demo", help="run the backing store and the sidecar with demo data")
    demo.add_argument(
        "--policies",
        default=None,
        help="policy directory (default: ./policies, else the shipped policies/)",
    )
    demo.add_argument(
        "--seconds",
        type=float,
        default=0,
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    demo.add_argument(
        "--front",
        choices=["envoy", "nginx"],
        default=None,
        help="serve the demo behind Envoy or nginx deciding with the decision service",
    )
    demo.set_defaults(func=_demo)

    from sidecar.cli import policy as policy_commands
    from sidecar.cli import quota as quota_commands

    policy = sub.add_parser("policy", help="check, test, explain and compile policy files")
    policy_commands.register(policy.add_subparsers(dest="policy_command", required=True))
    quota = sub.add_parser("quota", help="quota defaults, limits, usage and reconcile")
    quota_commands.register(quota.add_subparsers(dest="quota_command", required=True))
    from sidecar.cli import kubeconfig as kubeconfig_command

    kubeconfig_command.register(sub)  # an operator's per-tenant contexts (DESIGN §3)

    from sidecar.cli import fronts  # the decision service's fronts (DESIGN §13)

    front = sub.add_parser("config", help="print a runnable Envoy or nginx front config")
    fronts.register(front.add_subparsers(dest="config_command", required=True))
    front.set_defaults(func=fronts.run)

    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # Whoever read our output went away (`sidecar policy explain … | head`): stop
        # quietly as Unix tools do, and keep the interpreter's last flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


def _demo(args: argparse.Namespace) -> int:
    from sidecar.cli import demo

    return demo.run(args)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        overrides = {"workers": args.workers} if args.workers else None
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        return _config_error(exc)
    if config.workers > 1:
        from sidecar.services.identity.authenticators import build_authenticators

        try:  # once here, so N workers do not print the same error N times
            build_authenticators(config.identity)
        except ConfigError as exc:
            return _config_error(exc)
        return _serve_workers(config)
    return _serve_one(config, reuse_port=False)


def _one_line(text: object) -> str:
    """An error as one line of the operator's console (YAML errors span several)."""
    return " ".join(str(text).split())


def _config_error(exc: ConfigError) -> int:
    print(f"sidecar: {_one_line(exc)}", file=sys.stderr)
    return 2


class ListenError(Exception):
    """A listener could not bind its address."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"cannot listen on {address}: {reason}")


def _serve_one(config: Config, reuse_port: bool) -> int:
    """Serve until SIGTERM/SIGINT. A bad config or credential file, a policy that does
    not load, or an address in use ends the process with a short message, no
    traceback: these are the operator's to fix, not bugs."""
    from sidecar.app import build_app
    from sidecar.policy.source.store import PolicyLoadError

    try:
        tls = _load_tls(config)
        app = build_app(config)
    except PolicyLoadError as exc:
        print("sidecar: the policy does not load; nothing started:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        return _config_error(exc)
    try:
        run = _loop_runner(config.event_loop)
        run(_run(app, config, reuse_port, tls))
    except ConfigError as exc:
        return _config_error(exc)
    except ListenError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the audit file cannot be opened at start-up
        print(f"sidecar: cannot start: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0


def _loop_runner(choice: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """`asyncio.run` on the event loop `eventLoop` asks for (docs/performance.md:
    uvloop saves about a fifth of the CPU of each forwarded request)."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ConfigError("eventLoop is uvloop, but uvloop is not installed") from None
        else:
            return uvloop.run
    return asyncio.run


async def _start_site(site: web.BaseSite, address: str) -> None:
    try:
        await site.start()
    except OSError as exc:
        raise ListenError(address, exc.strerror or str(exc)) from None


def _load_tls(config: Config) -> TlsReloader | None:
    """The listener's TLS when `tls.certFile` and `tls.keyFile` are set; a file that
    cannot be read or loaded is a ConfigError naming its key."""
    from sidecar.edge.tls import TlsReloader

    return TlsReloader(config.tls) if config.tls.cert_file else None


async def _run(
    app: web.Application, config: Config, reuse_port: bool, tls: TlsReloader | None = None
) -> None:
    from sidecar.app import METRICS_KEY, OPS_KEY, READINESS_KEY
    from sidecar.core.redact import redact_url
    from sidecar.edge.health import build_metrics_app
    from sidecar.edge.server import CANCEL_SECONDS, FrontDoorRunner
    from sidecar.edge.tls import TlsSite

    host, port = config.listen_host_port
    grace = config.limits.shutdown_grace_seconds
    runners: list[web.BaseRunner | Any] = []  # those set up, to clean up
    if tls is not None:
        reloader = tls

        async def tls_ready() -> tuple[bool, str]:
            return reloader.ready()

        # A failed reload shows in /readyz but never makes it 503: the old cert serves.
        app[READINESS_KEY].add("tls", tls_ready)
        app[OPS_KEY].serving_tls(tls)  # sidecar_tls_certificate_* on /metrics
    try:
        main = FrontDoorRunner(
            app, handle_signals=False, shutdown_timeout=CANCEL_SECONDS, access_log=None
        )
        await main.setup()
        runners.append(main)
        site: web.BaseSite
        if tls is None:
            site = web.TCPSite(main, host, port, reuse_port=reuse_port or None)
        else:
            site = TlsSite(
                main,
                host,
                port,
                context=tls.context,
                handshake_timeout=config.limits.header_timeout,
                reuse_port=reuse_port or None,
            )
        await _start_site(site, config.listen)
        if tls is not None:
            await tls.start()
        if config.metrics_listen:
            # /metrics without credentials for a scraper, on its own address (§9);
            # always plain HTTP, also when the main listener serves TLS.
            mhost, _, mport = config.metrics_listen.rpartition(":")
            scrape = web.AppRunner(
                build_metrics_app(app[METRICS_KEY]),
                handle_signals=False,
                shutdown_timeout=CANCEL_SECONDS,
                access_log=None,
            )
            await scrape.setup()
            runners.append(scrape)
            msite = web.TCPSite(
                scrape, mhost.strip("[]"), int(mport), reuse_port=reuse_port or None
            )
            await _start_site(msite, config.metrics_listen)
            log.info("metrics (no credentials) on %s", config.metrics_listen)
        from sidecar.edge.authz.serve import serve_authz  # the decision service (§13)

        runners += await serve_authz(app, config, reuse_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "sidecar listening on %s://%s:%d, upstream %s",
            "https" if tls else "http",
            host,
            port,
            redact_url(config.upstream),
        )
        await stop.wait()
        # The process is gone by the deadline plus a second, whatever still waits then
        # (a stalled ledger under a cleanup): DESIGN §9.
        drain = max(0.0, config.shutdown_drain_seconds)
        _exit_by(drain + grace + SHUTDOWN_EXTRA_SECONDS)
        await _drain_readiness(app[READINESS_KEY], drain, stop)
        log.info("shutting down: finishing requests in flight (up to %.0f s)", grace)
        await main.drain(grace)
    finally:
        if tls is not None:
            await tls.stop()
        # What is left of the shutdown waits for no handler: drain() did (and cut them).
        for runner in reversed(runners):
            await runner.cleanup()


async def _drain_readiness(readiness: Readiness, seconds: float, again: asyncio.Event) -> None:
    """SIGTERM's first step (DESIGN §9): /readyz answers 503 for `seconds` while the
    listener still serves, so load balancers take the process out before it stops
    accepting. A second SIGTERM or SIGINT (an impatient operator) ends the wait."""
    readiness.shutting_down()
    if seconds <= 0:
        return
    log.info("shutting down: /readyz answers 503, still serving for %.1f s", seconds)
    again.clear()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(again.wait(), seconds)


# The process exits by `shutdownDrainSeconds` + `limits.shutdownGraceSeconds` plus this
# after SIGTERM (DESIGN §9).
SHUTDOWN_EXTRA_SECONDS = 1.0
# Of that second, what the orderly cleanup after the deadline may take before the
# process ends regardless (the rest is the interpreter's own exit).
_EXIT_MARGIN_SECONDS = 0.2


def _exit_by(seconds: float) -> None:
    """A last resort, armed at SIGTERM: end the process `seconds` from now (less a
    margin for the exit itself) if the orderly shutdown has not ended it by then, e.g.
    when a cleanup waits on a ledger or an upstream that stalls. Only after the
    requests were cut and their reservations handed over (drain): what was not settled
    stays in progress in the ledger, for the next process (DESIGN §7)."""

    def expire() -> None:
        log.error("shutdown: not done %.1f s after SIGTERM; exiting now", seconds)
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(max(0.0, seconds - _EXIT_MARGIN_SECONDS), expire)
    timer.daemon = True
    timer.start()


def _serve_workers(config: Config) -> int:
    """Fork `workers` processes that share the listening port through SO_REUSEPORT."""
    try:  # once here, so N workers do not print the same error N times
        _load_tls(config)
    except ConfigError as exc:
        return _config_error(exc)
    import shutil
    import tempfile

    from sidecar.services.metrics import enable_multiprocess, process_exited

    # Before forking: every worker's metrics go to this run's directory, and /metrics
    # sums them (DESIGN §9).
    metrics_dir = tempfile.mkdtemp(prefix="sidecar-metrics-")
    import sidecar.edge.authz.marker  # noqa: F401  (one marker key for every worker, §13)

    enable_multiprocess(metrics_dir)
    children: list[int] = []
    for _ in range(config.workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _serve_one(config, reuse_port=True)
            finally:
                os._exit(code)
        children.append(pid)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    worst = 0
    for child in children:
        _, status = os.waitpid(child, 0)
        process_exited(child)
        worst = max(worst, os.waitstatus_to_exitcode(status))
    shutil.rmtree(metrics_dir, ignore_errors=True)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())

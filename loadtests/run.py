"""Run one load scenario headless: `python loadtests/run.py SCENARIO [--seconds N] [--out DIR]`.

Scenarios: limits, noisy-neighbour, quota-race, mix, big-lists, many-tenants,
reconcile-flood (see loadtests/scenarios.py), or `all`. Everything the scenario starts
runs on 127.0.0.1 and is stopped before the command returns, also on SIGTERM or Ctrl-C
(loadtests/lifecycle.py). A progress line goes to stderr at least every 10 s.

Verdicts compare a figure as printed with its target as printed ("2.00 (target <= 2)"
is a PASS). Exit status: 0 when the run completed and every verdict is PASS; 1 when a
verdict is FAIL (with or without `--check`: a run never prints FAIL and exits 0); 2 on
a usage error or a failed start; 128 + the signal's number (143 SIGTERM, 130 SIGINT)
when stopped by a signal, after stopping everything it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `loadtests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests import lifecycle, stack
from loadtests.scenarios import DEFAULT_SECONDS, SCENARIOS, Options
from sidecar.config.redis_url import RedisUrlError, parse_redis_url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadtests/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="load duration (default per scenario, at most 30 s)",
    )
    parser.add_argument(
        "--out", default="loadtests/results", help="directory for CSVs, summaries and charts"
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every rate and count (the smoke test uses 0.1)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="sidecar processes sharing the port (sidecar serve --workers)",
    )
    parser.add_argument(
        "--global-tier",
        action="store_true",
        help="use the Redis global rate-limit tier (LOADTEST_REDIS, "
        "default redis://127.0.0.1:6379/0; keys removed afterwards)",
    )
    parser.add_argument(
        "--factor",
        type=float,
        default=10.0,
        help="noisy-neighbour: the noisy tenant offers this many times its limit "
        "(default 10; DESIGN §11 also names 40)",
    )
    parser.add_argument(
        "--ledger",
        default=None,
        metavar="URL",
        help="quota-race: race on this ledger only: sqlite:///path, redis://…, "
        "redis+cluster://H:P,H:P or redis+sentinel://H:P,H:P/SERVICE (rediss… for TLS); "
        "default SQLite, then the Redis at LOADTEST_REDIS",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        default=None,
        help="many-tenants: distinct tenants in all (default 1,000,000 x --scale)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a scenario misses its target (the default since every FAIL "
        "exits 1; kept for scripts)",
    )
    parser.add_argument(
        "--progress",
        type=float,
        default=lifecycle.PROGRESS_SECONDS,
        metavar="SECONDS",
        help="a progress line on stderr this often (at most, and by default, 10 s)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.progress <= lifecycle.PROGRESS_SECONDS:
        parser.error(f"--progress must be in (0, {lifecycle.PROGRESS_SECONDS:g}]")
    if args.ledger and not args.ledger.startswith("sqlite:///"):
        try:
            parse_redis_url(args.ledger)
        except RedisUrlError as exc:
            parser.error(f"--ledger: {exc}")
    if args.seconds is not None and not 0 < args.seconds <= 600:
        parser.error("--seconds must be in (0, 600]")
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.factor <= 0:
        parser.error("--factor must be positive")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.tenants is not None and args.tenants < 3000:
        parser.error("--tenants must be at least 3000")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    lifecycle.install(stack.running)
    try:
        with lifecycle.Progress(args.progress):
            return _run(args, names, out)
    except lifecycle.STOPPED:
        signum = lifecycle.interrupted()
        if not signum:
            raise
        # The `with Stack` blocks have stopped their processes on the way out; sweep
        # whatever is left (a stack opened without `with`, a load child).
        left = stack.close_all() + lifecycle.stop_children()
        print(
            f"loadtests/run.py: {signal.Signals(signum).name}: stopped every process the "
            "run started" + (f" ({left} in the last sweep)" if left else ""),
            file=sys.stderr,
            flush=True,
        )
        return 128 + signum


def _run(args: argparse.Namespace, names: list[str], out: Path) -> int:
    all_ok = True
    for name in names:
        lifecycle.note(f"scenario {name}")
        print(f"loadtests: scenario {name}: starting", file=sys.stderr, flush=True)
        seconds = args.seconds if args.seconds is not None else DEFAULT_SECONDS[name]
        try:
            opts = Options(
                seconds,
                args.scale,
                args.workers,
                args.global_tier,
                args.factor,
                args.ledger,
                tenants=args.tenants,
            )
            text, ok = SCENARIOS[name](out, opts)
        except RuntimeError as exc:
            print(f"{name}: could not run: {exc}", file=sys.stderr)
            return 2
        print(text)
        all_ok &= ok
    print(f"results in {out.resolve()}")
    if not all_ok:
        print("loadtests/run.py: a target was missed (FAIL above): exit 1", file=sys.stderr)
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

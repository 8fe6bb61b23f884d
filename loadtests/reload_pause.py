"""How long a policy reload stalls the event loop (DESIGN §11: never more than 10 ms).

Loads a generated policy (the generator of `bench_policy.py`), starts a reloader,
writes a changed policy of the same size and reloads it, while a ticker on the event
loop wakes every millisecond and allocates a little, as request handling does (so the
garbage collector runs as it would under traffic). The gaps between ticks are measured
during the reload and for a while after it (the old policy is released a few seconds
after the swap), and printed:

    python loadtests/reload_pause.py [--lines 10000 100000] [--after 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.bench_policy import generate
from sidecar.config.settings import ReloadConfig
from sidecar.policy.source.reload import RETIRE_DELAY_SECONDS, Reloader
from sidecar.policy.source.store import PolicyStore
from sidecar.services.metrics import Metrics


def pct(gaps: list[float], q: float) -> float:
    return sorted(gaps)[min(len(gaps) - 1, int(q * len(gaps)))] * 1000


async def measure(lines: int, after: float) -> dict[str, Any]:
    tenants = max(10, lines // 10)
    work = Path(tempfile.mkdtemp(prefix="reload-pause-"))
    (work / "p.yaml").write_text(generate(lines, tenants, random.Random(1))[0])
    t0 = time.perf_counter()
    store = PolicyStore([work])
    initial = time.perf_counter() - t0
    reloader = Reloader(store, Metrics(), ReloadConfig(enabled=False))
    await reloader.start()
    (work / "p.yaml").write_text(generate(lines, tenants, random.Random(2))[0])

    during: list[float] = []
    later: list[float] = []
    phase = during
    stop = False

    async def ticker() -> None:
        last = time.perf_counter()
        junk: list[dict[str, int]] = []
        while not stop:
            await asyncio.sleep(0.001)
            junk.append({"i": len(junk)})  # some garbage, as requests make
            if len(junk) > 200:
                junk.clear()
            now = time.perf_counter()
            phase.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    swapped = await reloader.reload_now()
    took = time.perf_counter() - t0
    phase = later
    await asyncio.sleep(max(after, RETIRE_DELAY_SECONDS + 2))
    stop = True
    await task
    await reloader.stop()
    return {
        "lines": store.current.engine.line_count,
        "initial_s": initial,
        "reload_s": took,
        "swapped": swapped,
        "during_p50_ms": pct(during, 0.5),
        "during_p99_ms": pct(during, 0.99),
        "during_max_ms": max(during) * 1000,
        "after_p99_ms": pct(later, 0.99),
        "after_max_ms": max(later) * 1000,
    }


def row(r: dict[str, Any]) -> str:
    return (
        f"| {r['lines']:,} | {r['initial_s']:.2f} s | {r['reload_s']:.2f} s "
        f"({'swapped' if r['swapped'] else 'NOT swapped'}) | {r['during_p50_ms']:.1f} / "
        f"{r['during_p99_ms']:.1f} / {r['during_max_ms']:.1f} ms | {r['after_p99_ms']:.1f} / "
        f"{r['after_max_ms']:.1f} ms |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument(
        "--after", type=float, default=8.0, help="seconds to keep measuring after the swap"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    print(
        "| policy lines | initial load | reload | loop gap during reload p50 / p99 / max "
        "| after the swap p99 / max |"
    )
    print("|---|---|---|---|---|")
    results = []
    for lines in args.lines:
        results.append(asyncio.run(measure(lines, args.after)))
        print(row(results[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

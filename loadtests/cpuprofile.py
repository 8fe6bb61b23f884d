"""Run a module under cProfile timed by the thread's CPU clock, not the wall clock.

    python -m loadtests.cpuprofile OUT.prof -m sidecar.cli serve --config …

`python -m cProfile` times calls by the wall clock: on a machine whose cores are shared
(the load generator, the store and the sidecar on two cores), a socket write that wakes
the reader often loses its core to it, and the write is billed for the time the sidecar
waited to run again. Timing by `time.thread_time` bills what the sidecar's own thread
spent (user and system CPU), which is what the overhead benchmark compares. Each timed
call costs a little more (a clock read is a system call), so compare calls, not totals.
The profile is written when the module returns or raises (the sidecar's own SIGTERM
handling ends `serve` normally).
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "-m":
        print("usage: python -m loadtests.cpuprofile OUT.prof -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    out, module, rest = argv[0], argv[2], argv[3:]
    sys.argv = [module, *rest]
    profiler = cProfile.Profile(time.thread_time)
    code = 0
    profiler.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    finally:
        profiler.disable()
        profiler.dump_stats(out)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

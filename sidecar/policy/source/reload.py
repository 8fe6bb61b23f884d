"""Policy hot reload: watch the policy paths, debounce, load off the event loop, swap.

- Changes are noticed with filesystem notifications (watchfiles) or, when
  `reload.pollSeconds > 0`, by polling a fingerprint of the policy files (path, size,
  mtime, inode). `request(force=True)` (the app's SIGHUP handler) reloads at once.
- A burst of edits is coalesced: the reload waits until nothing changed for
  `reload.debounceSeconds` (but never longer than 10 such windows in all).
- Loading, validating and compiling run in a dedicated thread, so request handling
  only ever pays for the final swap (one attribute write in `PolicyStore.apply`) and
  its share of the GIL (handed back every 0.5 ms during a load). The cyclic GC is
  paused during a load (its full collections stop every thread), and what exists at
  start-up is frozen out of later scans.
  Requests hold the bundle they started with, so none is decided by a mix.
- If the files changed while they were being read (a file written in two steps,
  deleted mid-load), the result is discarded and the load runs again.
- A change with problems is refused: the last good policy stays in force, each
  problem is logged as `file:line: message`, counted in
  `sidecar_policy_reload_total{result="failure"}` and shown in the `/readyz` details
  (readiness stays OK: a good policy is in force).
- `watching` is set once the file watcher runs (notifications registered, or the
  polling baseline taken), so a change made after it is never missed: tests and
  callers wait on it instead of sleeping.
- After each swap the `on_swap` callbacks get the new bundle (open watches are decided
  again with it, sidecar/edge/watches.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from sidecar.config.settings import ReloadConfig
from sidecar.policy.source import retire
from sidecar.policy.source.bundle import PolicyBundle
from sidecar.policy.source.files import Problem, policy_files
from sidecar.policy.source.store import PolicyStore

log = logging.getLogger("sidecar.policy")

MAX_DEBOUNCE_WINDOWS = 10
MAX_TORN_RETRIES = 3
FALLBACK_POLL_SECONDS = 2.0
LOAD_SWITCH_INTERVAL = 0.0005
RETIRE_DELAY_SECONDS = 5.0
RETIRE_ATTEMPTS = 24
# getrefcount's argument and the holder list: nothing else refers to the bundle.
OWN_REFS = 2

Fingerprint = tuple[tuple[str, int, int, int], ...]


def fingerprint(paths: Sequence[str | Path]) -> Fingerprint:
    """What the policy files look like on disk now; any change to any file changes it."""
    files, problems = policy_files(paths)
    out: list[tuple[str, int, int, int]] = [(f"!{p.file}", 0, 0, 0) for p in problems]
    for path in files:
        try:
            st = path.stat()
        except OSError:
            out.append((f"?{path}", 0, 0, 0))
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class ReloadReport(Protocol):
    """Where a reloader reports (`sidecar.services.metrics.Metrics` is one): the policy
    layer names no service."""

    def policy_reloaded(self, outcome: str) -> None:
        """One reload attempt ended: `success`, `unchanged` or `failure`."""

    def policy_installed(self, revision: str, rules: int) -> None:
        """A bundle is in force: its revision and its rule count."""


class Reloader:
    def __init__(self, store: PolicyStore, metrics: ReloadReport, config: ReloadConfig) -> None:
        self.store = store
        self.metrics = metrics
        self.config = config
        self._wake = asyncio.Event()
        self._forced = False
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()
        # Set when the file watcher runs: a change made after this is noticed.
        self.watching = asyncio.Event()
        # Called with the new bundle after each swap (sync, cheap: they schedule work).
        self.on_swap: list[Callable[[PolicyBundle], None]] = []
        # Counters for tests and /readyz.
        self.attempts = 0
        self.swaps = 0
        self.refusals = 0
        self.publish()

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            return
        # What exists after start-up (modules, the first policy) lives for the whole
        # process: keep it out of every later full collection's scan.
        gc.freeze()
        self._stopping.clear()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-reload")
        self._tasks.append(asyncio.create_task(self._run(), name="policy-reload"))
        if self.config.enabled:
            loop = asyncio.get_running_loop()
            baseline = await loop.run_in_executor(None, fingerprint, self.store.paths)
            watcher = self._poll(baseline) if self.config.poll_seconds > 0 else self._notify()
            self._tasks.append(asyncio.create_task(watcher, name="policy-watch"))

    async def stop(self) -> None:
        self._stopping.set()
        self.watching.clear()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # -- triggering ------------------------------------------------------------------

    def request(self, force: bool = False) -> None:
        """Ask for a reload; `force` skips the debounce (SIGHUP)."""
        self._forced = self._forced or force
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if not self._forced:
                await self._debounce()
            self._wake.clear()
            self._forced = False
            try:
                await self.reload_now()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the reload task die
                log.exception("policy reload failed unexpectedly; last good policy kept")

    async def _debounce(self) -> None:
        """Wait until no change came for one debounce window; never longer than
        MAX_DEBOUNCE_WINDOWS windows in all, so constant writes cannot starve reloads."""
        loop = asyncio.get_running_loop()
        window = self.config.debounce_seconds
        deadline = loop.time() + window * MAX_DEBOUNCE_WINDOWS
        while True:
            self._wake.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), min(window, remaining))
            except TimeoutError:
                return
            if self._forced:
                return

    # -- one reload ------------------------------------------------------------------

    async def reload_now(self) -> bool:
        """Load, validate, compile off the loop; swap if clean. Returns whether the
        policy in force changed."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            paths = self.store.paths
            bundle: PolicyBundle | None = None
            problems: list[Problem] = []
            for _ in range(MAX_TORN_RETRIES):
                before = await loop.run_in_executor(self._executor, fingerprint, paths)
                bundle, problems = await loop.run_in_executor(self._executor, self._load)
                after = await loop.run_in_executor(self._executor, fingerprint, paths)
                if before == after:
                    break
                log.info("policy files changed while loading; loading again")
            assert bundle is not None
            return self._finish(bundle, problems)

    def _load(self) -> tuple[PolicyBundle, list[Problem]]:
        """`store.load` with the cyclic garbage collector paused: a load allocates
        enough objects to trigger several full collections, and each one holds the
        GIL (stalling the event loop) for as long as it scans the whole heap."""
        was_enabled = gc.isenabled()
        interval = sys.getswitchinterval()
        gc.disable()
        # Hand the GIL back to the event loop thread more often while loading.
        sys.setswitchinterval(min(interval, LOAD_SWITCH_INTERVAL))
        try:
            return self.store.load()
        finally:
            sys.setswitchinterval(interval)
            # Everything allocated while the collector was paused (the new policy, a
            # million objects at 100k lines) would otherwise sit in the young
            # generation and be scanned, GIL held, by the next collections: hundreds
            # of ms. Frozen, it is never scanned. A policy has no reference cycles
            # (tested), so a retired one is still freed by reference counting.
            gc.freeze()
            if was_enabled:
                gc.enable()

    def _finish(self, bundle: PolicyBundle, problems: list[Problem]) -> bool:
        self.attempts += 1
        store = self.store
        if problems:
            self.refusals += 1
            store.apply(bundle, problems)
            self.metrics.policy_reloaded("failure")
            log.error(
                "policy change refused (%d problems); revision %s stays in force",
                len(problems),
                store.current.revision,
            )
            return False
        if bundle.revision == store.files.revision:
            store.last_error = []
            store.refused_at = None
            self.metrics.policy_reloaded("unchanged")
            return False
        retired = store.current
        retired_files = store.files
        old = retired.revision
        store.apply(bundle, problems)
        self._retire(retired)
        if retired_files is not retired:  # joined with the API objects: retire both
            self._retire(retired_files)
        del retired, retired_files
        self.swaps += 1
        self.metrics.policy_reloaded("success")
        log.info("policy reloaded: revision %s -> %s", old, store.current.revision)
        self._installed(store.current)
        return True

    def swap_in(self, bundle: PolicyBundle) -> None:
        """Put in force a bundle joined elsewhere (the API policy objects changed,
        `sidecar/services/apipolicy.py`): as a reload's swap, without reading files."""
        retired = self.store.current
        self.store.current = bundle
        if retired is not bundle:
            self._retire(retired)
        del retired
        self._installed(bundle)

    def _installed(self, bundle: PolicyBundle) -> None:
        self.publish()
        for callback in self.on_swap:
            try:
                callback(bundle)
            except Exception:  # the swap stands whatever a listener does
                log.exception("a policy swap listener failed")

    def _retire(self, bundle: PolicyBundle) -> None:
        """Free a replaced bundle from the reload thread, a piece at a time, once no
        request that started with it is still running (see `retire.py`)."""
        self._schedule_release([bundle], RETIRE_ATTEMPTS)

    def _schedule_release(self, holder: list[Any], attempts: int) -> None:
        executor = self._executor
        loop = asyncio.get_running_loop()

        def done(future: Future[bool]) -> None:
            if future.cancelled() or future.exception() is not None or future.result():
                return
            if attempts > 1:
                loop.call_soon_threadsafe(self._schedule_release, holder, attempts - 1)
            else:  # held for minutes (a watch): its last holder frees it
                loop.call_soon_threadsafe(holder.clear)

        def submit() -> None:
            if executor is None or self._executor is not executor:
                holder.clear()
                return
            executor.submit(_release, holder).add_done_callback(done)

        loop.call_later(RETIRE_DELAY_SECONDS, submit)

    def publish(self) -> None:
        bundle = self.store.current
        self.metrics.policy_installed(bundle.revision, bundle.engine.line_count)

    # -- readiness -------------------------------------------------------------------

    async def ready(self) -> tuple[bool, str]:
        store = self.store
        loaded = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(store.loaded_at))
        detail = f"revision {store.current.revision} in force since {loaded}"
        if store.last_error:
            # Problems name files and tenants: counted here, listed in the log (§9).
            count = len(store.last_error)
            detail += (
                f"; last change refused: {count} problem(s), policy reload failed (see the log)"
            )
        return True, detail

    # -- watchers --------------------------------------------------------------------

    async def _notify(self) -> None:
        try:
            import watchfiles

            existing = [str(p) for p in self.store.paths if p.exists()]
            if not existing:
                raise FileNotFoundError("no policy path exists")
            # awatch registers its watches synchronously on the first step, before its
            # first suspension; a callback scheduled now runs only after that.
            asyncio.get_running_loop().call_soon(self.watching.set)
            async for _changes in watchfiles.awatch(
                *existing, stop_event=self._stopping, recursive=True, step=50
            ):
                self.request()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.watching.clear()  # set again once the polling baseline is taken
            log.warning("policy watch via notifications failed (%s); polling instead", exc)
        if not self._stopping.is_set():
            await self._poll(None, FALLBACK_POLL_SECONDS)

    async def _poll(self, baseline: Fingerprint | None, interval: float | None = None) -> None:
        every = interval if interval is not None else self.config.poll_seconds
        loop = asyncio.get_running_loop()
        paths = self.store.paths
        last = baseline
        if last is None:
            last = await loop.run_in_executor(None, fingerprint, paths)
        self.watching.set()
        while not self._stopping.is_set():
            await asyncio.sleep(every)
            now = await loop.run_in_executor(None, fingerprint, paths)
            if now != last:
                last = now
                self.request()


def _release(holder: list[Any]) -> bool:
    """In the reload thread: take a retired bundle apart if nothing else holds it;
    False (and nothing done) while a request still does."""
    if sys.getrefcount(holder[0]) > OWN_REFS:
        return False
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, LOAD_SWITCH_INTERVAL))
    try:
        retire.dismantle(holder)
    finally:
        sys.setswitchinterval(interval)
    return True


__all__ = ["Reloader", "fingerprint"]

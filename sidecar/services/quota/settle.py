"""Settling what the quota stage did not see (DESIGN §7: "an outcome the sidecar did not
see is settled, never assumed").

Owns three kinds of work that outlive the request that started them:

- **Unknown outcomes of creates.** A create was forwarded but no complete answer came
  back (a timeout, a cut connection, a 5xx, the client or the sidecar going away): the
  store may or may not have made the object, and may still be making it. Its
  reservation stays in progress (it still counts against the quota), is marked in the
  ledger with the object it would have made and the time from which a 404 may release
  it (`Ledger.mark_unsettled`, so any sidecar process can finish it), and the object is
  read from the store by name, again and again with backoff: found → committed at once
  with the charge of the object as stored (and that object kept as the answer an
  `Idempotency-Key` retry gets); 404 → released, but only once the settling window
  (`quota.settleAfterSeconds` after the exchange ended; by default, and at the latest,
  when the reservation expires) has passed: until then the upstream may still be
  acting on the write, and a 404 proves nothing. A create without a name
  (`generateName`) cannot be read back: it is left in progress until its reservation
  expires, and the next reconcile counts what the store holds.
- **Unknown outcomes of updates**: the same reads. The object as stored with the charge
  the update would give it (the upstream's dry run) → that charge is committed at once;
  in any other state (unchanged, changed otherwise, gone) the increase stays reserved,
  and the object claimed, until the window has passed: then what is stored is
  committed (404: released).
- **Ledger calls whose answer was lost** (a Redis that stalled past the client's
  timeout, a ledger that failed): the call is made again with backoff until the ledger
  answers. Every ledger operation is idempotent (by reservation id; a delete by the
  object and the time it was deleted), and a release remembers an id it has not seen,
  so a reserve that timed out and ran when the ledger resumed is undone rather than
  held until the TTL. A release is given up once the reservation would have expired
  anyway; a commit or a delete is not (the object exists, or is gone).

`sweep()` settles the reservations other processes marked and left (a sidecar stopped
at its shutdown deadline with creates in flight), each keeping the release time it was
marked with: at start and every `SWEEP_SECONDS`. Two processes settling the same
reservation is harmless: commit is once per object, release once per reservation.

At shutdown (`stop`), marks still being written get a moment, then everything is
cancelled: what was not settled stays in progress in the ledger (marked, for the next
process), never released blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

from sidecar.core.quantities import TRACKED, QuantityError
from sidecar.core.status import StatusError
from sidecar.services.quota.ledger import Answer, Ledger, LedgerError, ObjectRef, Reservation
from sidecar.services.quota.meters import Charge, charge_for

log = logging.getLogger("sidecar.quota.settle")
T = TypeVar("T")

# GET one object of the store by path: (status, JSON body); StatusError when the store
# cannot answer (unreachable, timeout, a cut answer).
Fetch = Callable[[str], Awaitable[tuple[int, Any]]]

FIRST_RETRY_SECONDS = 0.1
MAX_RETRY_SECONDS = 10.0
# At most this many settlements and ledger retries at once; beyond, a reservation is
# left to its TTL (and a marked one to the next sweep), and a warning is logged.
MAX_OPEN = 10000
SWEEP_SECONDS = 60.0
# At shutdown, how long marks still being written may take before all is cancelled.
STOP_WAIT_SECONDS = 0.3
WARN_EVERY_SECONDS = 10.0


class Settler:
    def __init__(
        self,
        ledger: Ledger,
        fetch: Fetch,
        failed: Callable[[str], None] | None = None,
        settle_after: float | None = None,
    ) -> None:
        self.ledger = ledger
        self.fetch = fetch
        # Told the operation's name on every failed ledger call (the metrics count them).
        self.failed = failed or (lambda _op: None)
        # How long after an exchange ended a 404 on reading its object back may release
        # it (None: when the reservation expires; `quota.settleAfterSeconds`).
        self.settle_after = settle_after
        self._tasks: set[asyncio.Task[Any]] = set()
        self._marking: set[asyncio.Task[Any]] = set()
        self._settling: set[str] = set()  # reservation ids this process is settling
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._dropped = 0
        self._warned = -WARN_EVERY_SECONDS

    # -- unknown outcomes ------------------------------------------------------------

    def release_after(self, reservation: Reservation) -> float:
        """The ledger time from which a 404 may release `reservation`, whose exchange
        ended now: the settling window from now, never later than its expiry."""
        expiry = _expiry(self.ledger, reservation)
        if self.settle_after is None:
            # A reservation without an expiry (never recorded): one TTL from now.
            return expiry if expiry is not None else self.ledger.clock() + self.ledger.ttl
        ends = self.ledger.clock() + self.settle_after
        return ends if expiry is None else min(ends, expiry)

    def settle_create(
        self,
        reservation: Reservation,
        obj: ObjectRef,
        mark: bool = True,
        release_after: float | None = None,
    ) -> None:
        """The create of `obj` under `reservation` had no answer the sidecar saw (its
        exchange ended now, or, from a sweep, was marked to be released from
        `release_after` on)."""
        if reservation.id in self._settling:
            return
        after = self.release_after(reservation) if release_after is None else release_after
        task = self._spawn(self._settle(reservation, obj, mark, after, None), reservation.id)
        if mark and task is not None:
            # Counted from now (not from when it first runs): a shutdown waits for it.
            self._marking.add(task)

    def settle_update(self, reservation: Reservation, obj: ObjectRef, expected: Charge) -> None:
        """An update of `obj` (holding `reservation`: its claim and its increase) that
        would make its charge `expected` had no answer the sidecar saw."""
        after = self.release_after(reservation)
        self._spawn(self._settle(reservation, obj, False, after, expected), reservation.id)

    async def _settle(
        self,
        r: Reservation,
        obj: ObjectRef,
        mark: bool,
        release_after: float,
        expected: Charge | None,
    ) -> None:
        """Read `obj` back until its outcome is told (see the module docstring);
        `expected`: the charge an update would give it (None: a create)."""
        if mark:
            try:
                await self.ledger.mark_unsettled(r, obj, release_after)
            except LedgerError as exc:  # settled all the same; only other processes miss it
                self.failed("mark_unsettled")
                log.warning("could not mark %s unsettled: %s", _named(obj), exc.detail)
            finally:
                task = asyncio.current_task()
                if task is not None:
                    self._marking.discard(task)
        delay = FIRST_RETRY_SECONDS
        while True:
            # Taken before the read: only a read sent once the window has passed may
            # release (a write may land while an earlier read is on its way).
            window_passed = self.ledger.clock() >= release_after
            found = await read_back(self.fetch, obj)
            if found:
                charge = _stored_charge(obj.resource, found, expected or r.charge)
            if found and expected is None:
                answer = _replay_of(found)
                await self.retry(
                    partial(self.ledger.commit, r, obj.name, obj.resource, charge, answer),
                    "commit",
                )
                log.info("settled %s: found in the store, charged", _named(obj))
                return
            if found and expected is not None:
                if _same(charge, expected) or window_passed:
                    await self.retry(
                        partial(self.ledger.commit_change, r, obj, charge), "commit_change"
                    )
                    log.info("settled the update of %s: charged as stored", _named(obj))
                    return
            elif found is not None and window_passed:  # {}: not in the store
                await self.retry(lambda: self.ledger.release(r), "release", _expiry(self.ledger, r))
                log.info("settled %s: not in the store, released", _named(obj))
                return
            # Not told yet (not in the store, not changed yet, or no answer): again.
            wait = None if found is None else max(release_after - self.ledger.clock(), 0.0)
            delay = await _backoff(delay, wait)

    # -- ledger calls whose answer was lost ----------------------------------------------

    async def retry(
        self, call: Callable[[], Awaitable[T]], op: str, until: float | None = None
    ) -> T | None:
        """`call()` (the ledger operation `op`) until the ledger answers (LedgerError:
        again, with backoff); None when given up at the ledger time `until` (a
        reservation that has expired anyway)."""
        delay = FIRST_RETRY_SECONDS
        warned = False
        while True:
            try:
                return await call()
            except LedgerError as exc:
                self.failed(op)
                if not warned:
                    log.warning("quota ledger %s failed, retrying: %s", op, exc.detail)
                    warned = True
            if until is not None and self.ledger.clock() >= until:
                log.warning("quota ledger %s given up: the reservation has expired", op)
                return None
            delay = await _backoff(delay)

    def compensate(
        self, call: Callable[[], Awaitable[Any]], op: str, until: float | None = None
    ) -> None:
        """`retry` in the background (the request does not wait for the ledger)."""
        self._spawn(self.retry(call, op, until))

    def release_later(self, r: Reservation) -> None:
        """Release `r` once the ledger answers (a reserve or release whose answer was
        lost: it may have run, or may still run)."""
        self.compensate(lambda: self.ledger.release(r), "release", _expiry(self.ledger, r))

    async def now_or_later(self, call: Callable[[], Awaitable[Any]], op: str) -> None:
        """`call()` now; if the ledger fails, again in the background until it answers.
        The caller waits for the first attempt only (shielded from its cancellation)."""
        task = asyncio.ensure_future(call())
        try:
            await asyncio.shield(task)
            return
        except LedgerError as exc:
            self.failed(op)
            log.warning("quota ledger %s failed, retrying: %s", op, exc.detail)
        except asyncio.CancelledError:
            # The caller went away; the attempt goes on, and is retried if it fails.
            task.add_done_callback(lambda t: self._again_if_failed(t, call, op))
            raise
        self.compensate(call, op)

    def _again_if_failed(
        self, task: asyncio.Future[Any], call: Callable[[], Awaitable[Any]], op: str
    ) -> None:
        if not task.cancelled() and isinstance(task.exception(), LedgerError):
            self.failed(op)
            self.compensate(call, op)

    # -- sweeps --------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Settle every reservation marked unsettled that this process is not settling
        already; the number taken up."""
        taken = 0
        for tenant in await self.ledger.tenants():
            for r, obj, release_after in await self.ledger.unsettled(tenant):
                if r.id not in self._settling and obj.resource in TRACKED:
                    self.settle_create(r, obj, mark=False, release_after=release_after)
                    taken += 1
        if taken:
            log.info("settling %d reservations left unsettled by earlier processes", taken)
        return taken

    async def sweeps(self, every: float = SWEEP_SECONDS) -> None:
        """`sweep()` now and every `every` seconds (a ledger error: next time)."""
        while True:
            try:
                await self.sweep()
            except LedgerError as exc:
                log.debug("quota settle sweep failed: %s", exc.detail)
            await asyncio.sleep(every)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self.sweeps())

    async def stop(self) -> None:
        """Let marks being written finish (briefly), then cancel everything: what is not
        settled stays in progress in the ledger."""
        self._stopping = True
        if self._marking:
            await asyncio.wait(set(self._marking), timeout=STOP_WAIT_SECONDS)
        tasks = list(self._tasks)
        sweeper, self._sweeper = self._sweeper, None
        everything = [*tasks, *([sweeper] if sweeper else [])]
        for task in everything:
            task.cancel()
        for task in everything:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if tasks:
            log.info("stopped with %d settlements or ledger retries open", len(tasks))

    def background(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Other work that outlives its request (a reconcile after a deletecollection),
        cancelled at shutdown like the rest."""
        self._spawn(coro)

    def _spawn(
        self, coro: Coroutine[Any, Any, Any], key: str | None = None
    ) -> asyncio.Task[Any] | None:
        if self._stopping or len(self._tasks) >= MAX_OPEN:
            coro.close()
            if not self._stopping:
                self._dropped += 1
                now = time.monotonic()
                if now - self._warned >= WARN_EVERY_SECONDS:
                    log.warning(
                        "%d quota settlements open: %d more left to their TTL (and the "
                        "next sweep or reconcile)",
                        len(self._tasks),
                        self._dropped,
                    )
                    self._warned, self._dropped = now, 0
            return None
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._marking.discard)
        if key is not None:
            self._settling.add(key)
            task.add_done_callback(lambda _: self._settling.discard(key))
        return task


async def read_back(fetch: Fetch, obj: ObjectRef) -> dict[str, Any] | None:
    """The object as the store holds it ({} when it has none: 404); None when the store
    gave no answer that says (unreachable, a timeout, a 5xx…)."""
    path = TRACKED[obj.resource].item_path(obj.tenant, obj.namespace, obj.name)
    try:
        status, body = await fetch(path)
    except StatusError:
        return None
    if status == 200 and isinstance(body, dict) and body:
        return body
    if status == 404:
        return {}
    log.debug("settling %s: the store answered %s; again later", _named(obj), status)
    return None


async def settle_marked(ledger: Ledger, fetch: Fetch, tenant: str) -> int:
    """One pass over a tenant's reservations marked unsettled (for a reconcile): each
    read back once and committed if found, released if not found once its settling
    window has passed; one the store does not answer for, or whose window is still
    open, is left for later. The number settled. LedgerError when the ledger fails."""
    settled = 0
    for r, obj, release_after in await ledger.unsettled(tenant):
        if obj.resource not in TRACKED:
            continue
        found = await read_back(fetch, obj)
        if found is None or (not found and ledger.clock() < release_after):
            continue
        if found:
            charge = _stored_charge(obj.resource, found, r.charge)
            await ledger.commit(r, obj.name, obj.resource, charge, _replay_of(found))
        else:
            await ledger.release(r)
        settled += 1
    return settled


def _replay_of(obj: dict[str, Any]) -> Answer:
    """What an `Idempotency-Key` retry of a settled create gets: the stored object."""
    return Answer(201, "application/json", json.dumps(obj).encode())


def _named(obj: ObjectRef) -> str:
    where = f"{obj.tenant}/{obj.namespace}" if obj.namespace else obj.tenant
    return f"{obj.resource} {where}/{obj.name}"


def _stored_charge(resource: str, obj: dict[str, Any], fallback: Charge) -> Charge:
    try:
        return charge_for(resource, obj)
    except QuantityError:
        return dict(fallback)


def _expiry(ledger: Ledger, r: Reservation) -> float | None:
    return r.created + ledger.ttl if r.created else None


def _same(a: Charge, b: Charge) -> bool:
    return {k: v for k, v in a.items() if v} == {k: v for k, v in b.items() if v}


async def _backoff(delay: float, at_most: float | None = None) -> float:
    """Sleep about `delay` (jittered, so many settlers do not retry in step), or
    `at_most` when that is shorter (a settling window ending); the next delay."""
    pause = delay * (0.5 + random.random())
    await asyncio.sleep(pause if at_most is None else min(pause, at_most))
    return min(delay * 2, MAX_RETRY_SECONDS)

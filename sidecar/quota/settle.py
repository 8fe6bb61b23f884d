"""Settling what the quota stage did not see (DESIGN §7: "an outcome the sidecar did not
see is settled, never assumed").

Owns three kinds of work that outlive the request that started them:

- **Unknown outcomes of creates.** A create was forwarded but no complete answer came
  back (a timeout, a cut connection, a 5xx, the client or the sidecar going away): the
  store may or may not have made the object. Its reservation stays in progress (it
  still counts against the quota), is marked in the ledger with the object it would
  have made (`Ledger.mark_unsettled`, so any sidecar process can finish it), and the
  object is read from the store by name, again with backoff until the store answers:
  found → committed with the charge of the object as stored (and that object kept as
  the answer an `Idempotency-Key` retry gets); 404 → released. A create without a name
  (`generateName`) cannot be read back: it is left in progress until its reservation
  expires, and the next reconcile counts what the store holds.
- **Unknown outcomes of updates**: the same read; the object's charge as stored is
  committed (404: the increase is released).
- **Ledger calls whose answer was lost** (a Redis that stalled past the client's
  timeout, a ledger that failed): the call is made again with backoff until the ledger
  answers. Every ledger operation is idempotent by reservation id, and a release
  remembers an id it has not seen, so a reserve that timed out and ran when the ledger
  resumed is undone rather than held until the TTL. A release is given up once the
  reservation would have expired anyway; a commit is not (the object exists).

`sweep()` settles the reservations other processes marked and left (a sidecar stopped
at its shutdown deadline with creates in flight): at start and every `SWEEP_SECONDS`.
Two processes settling the same reservation is harmless: commit is once per object,
release once per reservation.

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

from sidecar.errors import StatusError
from sidecar.quantities import TRACKED, QuantityError
from sidecar.quota.ledger import Answer, Ledger, LedgerError, ObjectRef, Reservation
from sidecar.quota.meters import Charge, charge_for

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
        self, ledger: Ledger, fetch: Fetch, failed: Callable[[str], None] | None = None
    ) -> None:
        self.ledger = ledger
        self.fetch = fetch
        # Told the operation's name on every failed ledger call (the metrics count them).
        self.failed = failed or (lambda _op: None)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._marking: set[asyncio.Task[Any]] = set()
        self._settling: set[str] = set()  # reservation ids this process is settling
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._dropped = 0
        self._warned = -WARN_EVERY_SECONDS

    @property
    def open(self) -> int:
        """Settlements and ledger retries still running (for tests and the log)."""
        return len(self._tasks)

    # -- unknown outcomes ------------------------------------------------------------

    def settle_create(self, reservation: Reservation, obj: ObjectRef, mark: bool = True) -> None:
        """The create of `obj` under `reservation` had no answer the sidecar saw."""
        if reservation.id in self._settling:
            return
        self._spawn(self._settle(reservation, obj, mark, update=False), reservation.id)

    def settle_update(self, reservation: Reservation, obj: ObjectRef) -> None:
        """An update of `obj` (holding `reservation`: its claim and its increase) had no
        answer the sidecar saw."""
        self._spawn(self._settle(reservation, obj, False, update=True), reservation.id)

    async def _settle(self, r: Reservation, obj: ObjectRef, mark: bool, update: bool) -> None:
        if mark:
            task = asyncio.current_task()
            assert task is not None
            self._marking.add(task)
            try:
                await self.ledger.mark_unsettled(r, obj)
            except LedgerError as exc:  # settled all the same; only other processes miss it
                self.failed("mark_unsettled")
                log.warning("could not mark %s unsettled: %s", _named(obj), exc.detail)
            finally:
                self._marking.discard(task)
        delay = FIRST_RETRY_SECONDS
        while True:
            found = await read_back(self.fetch, obj)
            if found is not None:
                if found:
                    charge = _stored_charge(obj.resource, found, r.charge)
                    if update:
                        await self.retry(
                            partial(self.ledger.commit_change, r, obj, charge), "commit_change"
                        )
                    else:
                        answer = _replay_of(found)
                        await self.retry(
                            partial(self.ledger.commit, r, obj.name, obj.resource, charge, answer),
                            "commit",
                        )
                    log.info("settled %s: found in the store, charged", _named(obj))
                else:
                    await self.retry(
                        lambda: self.ledger.release(r), "release", _expiry(self.ledger, r)
                    )
                    log.info("settled %s: not in the store, released", _named(obj))
                return
            delay = await _backoff(delay)

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
            for r, obj in await self.ledger.unsettled(tenant):
                if r.id not in self._settling and obj.resource in TRACKED:
                    self.settle_create(r, obj, mark=False)
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

    def _spawn(self, coro: Coroutine[Any, Any, Any], key: str | None = None) -> None:
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
            return
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if key is not None:
            self._settling.add(key)
            task.add_done_callback(lambda _: self._settling.discard(key))


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
    read back once and committed or released; one the store does not answer for is left
    for later. The number settled. LedgerError when the ledger fails."""
    settled = 0
    for r, obj in await ledger.unsettled(tenant):
        if obj.resource not in TRACKED:
            continue
        found = await read_back(fetch, obj)
        if found is None:
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


async def _backoff(delay: float) -> float:
    """Sleep about `delay` (jittered, so many settlers do not retry in step); the next."""
    await asyncio.sleep(delay * (0.5 + random.random()))
    return min(delay * 2, MAX_RETRY_SECONDS)

"""Where a protobuf body is converted: in place when that is cheap, otherwise in a small
pool of worker processes shared fairly between tenants (DESIGN §6, §10, §11).

Decoding is C code (upb) that holds the GIL: in a thread it would stop the event loop
as surely as on it, and converting a large body is seconds of Python. What converting
costs grows with the object's *parts* (every message and every list or map entry,
`codec.count_parts`), a few microseconds each, not with its bytes. So a body of at most
`INLINE_MAX_BYTES` is parsed in place (a fraction of a millisecond at that size), and
converted in place when it has at most `INLINE_MAX_PARTS` parts: about half a
millisecond at worst (measured: docs/security.md), and every body kubectl's typed
commands send for ordinary objects (a `create configmap --from-file` of a few KB is
three parts). Anything larger goes to a worker process (worker.py).

The pool (`_Pool`) holds `WORKERS` worker processes, each with its own thread of a
dedicated executor of exactly that size, which does the blocking pipe I/O; threads
are handed work only when their worker is free, so none ever waits on a lock, and the
asyncio default executor (credential, TLS and policy reloads) is never used here. The
pool is fair between tenants (the caller's tenant, as the rate limit keys it):

- a tenant has at most `PER_TENANT` bodies in the workers at once; its other bodies
  wait in the tenant's own queue, and a free worker goes to the waiting tenant served
  least recently: a body waits for one body of each tenant ahead of its own in that
  order, never for another tenant's backlog (with one tenant flooding, another's body
  finds a free worker at once);
- a body that waits more than `QUEUE_TIMEOUT_SECONDS` for its turn is 429 with
  `Retry-After` (the tenant's in-flight limit bounds how many can wait);
- a conversion that takes more than `CONVERT_TIMEOUT_SECONDS` is 503 with
  `Retry-After`: its worker is killed (which ends the thread's wait at once) and the
  next body starts a new one.

A worker is started by the first body it is given and replaced every
`_TASKS_PER_WORKER` bodies, so that memory a large decode took is given back.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass

import sidecar.services.codecs.kube_protobuf.worker as worker
from sidecar.core.status import StatusError
from sidecar.services.codecs.kube_protobuf.codec import (
    ProtobufError,
    Transcoded,
    count_parts,
    decode,
    finish,
)

INLINE_MAX_BYTES = 16 * 1024
INLINE_MAX_PARTS = 128
WORKERS = 2
PER_TENANT = 1
QUEUE_TIMEOUT_SECONDS = 10.0
CONVERT_TIMEOUT_SECONDS = 10.0
RETRY_AFTER_SECONDS = 1
_TASKS_PER_WORKER = 32
_SERVED_KEPT = 1024
# The worker's command line (tests put a worker that never answers here: a fault).
WORKER_COMMAND = [sys.executable, "-m", "sidecar.services.codecs.kube_protobuf"]


@dataclass
class Counts:
    """What happened to the protobuf bodies of this process."""

    inline: int = 0  # converted in place
    worker: int = 0  # sent to a worker
    waited: int = 0  # of those, waited for their tenant's turn
    queue_timeouts: int = 0  # 429: waited too long
    convert_timeouts: int = 0  # 503: converted too long, worker replaced


COUNTS = Counts()


class _WorkerGone(Exception):
    pass


class _Worker:
    """One worker process, spoken to by one thread at a time (its `_Slot`'s)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(WORKER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.tasks = 0

    def exchange(self, body: bytes, max_json_bytes: int) -> bytes:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        self.tasks += 1
        try:
            stdin.write(worker.REQUEST.pack(len(body), max_json_bytes))
            stdin.write(body)
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise _WorkerGone from None
        try:
            header = worker.read_exact(stdout, worker.LENGTH.size)  # type: ignore[arg-type]
            frame = None
            if header is not None:
                frame = worker.read_exact(stdout, worker.LENGTH.unpack(header)[0])  # type: ignore[arg-type]
        except (OSError, ValueError):
            frame = None
        if frame is None:
            raise _WorkerGone
        return frame

    def kill(self) -> None:
        """At once, from any thread: a thread reading its answer gets the end of it."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def stop(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Job:
    """One body given to a slot; `abandoned` once its caller stopped waiting for it."""

    def __init__(self, body: bytes, max_json_bytes: int) -> None:
        self.body = body
        self.max_json_bytes = max_json_bytes
        self.abandoned = False


class _Slot:
    """A worker process (started when first needed) and the one thread that uses it at
    a time. `run` is called in the pool's executor, `abandon` from the event loop."""

    def __init__(self) -> None:
        self.worker: _Worker | None = None
        self._lock = threading.Lock()  # held for an assignment, never across I/O

    def run(self, job: _Job) -> bytes:
        with self._lock:
            if job.abandoned:
                raise _WorkerGone
            current = self.worker
        if current is None:
            try:
                current = _Worker()
            except OSError:  # could not start one (no memory, no processes left)
                raise _WorkerGone from None
            with self._lock:
                if job.abandoned:  # its time ran out while the worker started
                    abandoned = True
                else:
                    abandoned, self.worker = False, current
            if abandoned:
                current.stop()
                raise _WorkerGone
        try:
            return current.exchange(job.body, job.max_json_bytes)
        except _WorkerGone:
            self._retire(current)
            raise
        finally:
            if current.tasks >= _TASKS_PER_WORKER:
                self._retire(current)

    def _retire(self, current: _Worker) -> None:
        with self._lock:
            if self.worker is current:
                self.worker = None
        current.stop()

    def abandon(self, job: _Job) -> None:
        """The job took too long: its worker is killed (its thread's read ends, and the
        thread reaps it) and the slot's next job starts a new one."""
        with self._lock:
            job.abandoned = True
            current, self.worker = self.worker, None
        if current is not None:
            current.kill()

    def stop(self) -> None:
        with self._lock:
            current, self.worker = self.worker, None
        if current is not None:
            current.stop()


class _Pool:
    """The worker slots and their fair sharing between tenants, on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.slots = [_Slot() for _ in range(WORKERS)]
        self.idle = list(self.slots)
        # Exactly one thread per slot: a thread is given work only with a free slot.
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=WORKERS, thread_name_prefix="protobuf-offload"
        )
        self.busy: dict[str, int] = {}  # tenant → its bodies in a worker
        self.queues: dict[str, deque[asyncio.Future[_Slot]]] = {}  # tenant → waiting
        # tenant → when it was last given a worker (a grant count); a free worker goes
        # to the waiting tenant served least recently (never served: first).
        self.served: dict[str, int] = {}
        self.grants = 0

    async def convert(self, tenant: str, body: bytes, max_json_bytes: int) -> bytes:
        slot = await self._acquire(tenant)
        job = _Job(body, max_json_bytes)
        try:
            done = self.executor.submit(slot.run, job)
        except RuntimeError:  # the pool was stopped (the sidecar is shutting down)
            self._release(tenant, slot)
            raise _WorkerGone from None
        # The slot is free again when its thread is done, not when this caller stops
        # waiting: a slot is never given to two threads at once.
        done.add_done_callback(lambda _: self._release_soon(tenant, slot))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(done), CONVERT_TIMEOUT_SECONDS)
        except TimeoutError:
            slot.abandon(job)
            COUNTS.convert_timeouts += 1
            raise StatusError(
                503,
                f"converting this protobuf body took more than {CONVERT_TIMEOUT_SECONDS:g} "
                "seconds; try again, or send the object as JSON",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None

    async def _acquire(self, tenant: str) -> _Slot:
        if self.idle and tenant not in self.queues and self.busy.get(tenant, 0) < PER_TENANT:
            return self._grant(tenant)
        COUNTS.waited += 1
        waiter: asyncio.Future[_Slot] = self.loop.create_future()
        self.queues.setdefault(tenant, deque()).append(waiter)
        try:
            async with asyncio.timeout(QUEUE_TIMEOUT_SECONDS):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._release(tenant, waiter.result())  # granted as the wait ended
            else:
                waiter.cancel()
                self._forget(tenant, waiter)
            if isinstance(exc, TimeoutError):
                COUNTS.queue_timeouts += 1
                raise StatusError(
                    429,
                    f"this tenant's protobuf bodies waited more than "
                    f"{QUEUE_TIMEOUT_SECONDS:g} seconds for a decoder; send fewer large "
                    "protobuf bodies at once, or send JSON",
                    details={"retryAfterSeconds": RETRY_AFTER_SECONDS},
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                ) from None
            raise

    def _grant(self, tenant: str) -> _Slot:
        self.busy[tenant] = self.busy.get(tenant, 0) + 1
        self.grants += 1
        self.served[tenant] = self.grants
        if len(self.served) > _SERVED_KEPT + 2 * (len(self.busy) + len(self.queues)):
            # Forget idle tenants (memory stays flat with many tenants): one that comes
            # back counts as never served, which it nearly is.
            self.served = {
                t: n for t, n in self.served.items() if t in self.busy or t in self.queues
            }
        return self.idle.pop()

    def _forget(self, tenant: str, waiter: asyncio.Future[_Slot]) -> None:
        queue = self.queues.get(tenant)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            pass
        if not queue:
            del self.queues[tenant]

    def _release_soon(self, tenant: str, slot: _Slot) -> None:
        # In the slot's thread: hand the release to the event loop.
        try:
            self.loop.call_soon_threadsafe(self._release, tenant, slot)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _release(self, tenant: str, slot: _Slot) -> None:
        left = self.busy.get(tenant, 0) - 1
        if left > 0:
            self.busy[tenant] = left
        else:
            self.busy.pop(tenant, None)
        self.idle.append(slot)
        self._dispatch()

    def _dispatch(self) -> None:
        """Free slots to waiting tenants within their PER_TENANT, the tenant served
        least recently first, one body at a time."""
        while self.idle:
            waiting = [t for t in self.queues if self.busy.get(t, 0) < PER_TENANT]
            if not waiting:
                return
            tenant = min(waiting, key=lambda t: self.served.get(t, 0))
            queue = self.queues[tenant]
            waiter = queue.popleft()
            if not queue:
                del self.queues[tenant]
            if not waiter.done():  # one that gave up is on its way out
                waiter.set_result(self._grant(tenant))

    def stop(self) -> None:
        """Stop every worker (blocking: up to a couple of seconds each)."""
        self.executor.shutdown(wait=False)
        for slot in self.slots:
            slot.stop()

    def pids(self) -> list[int]:
        return [s.worker.proc.pid for s in self.slots if s.worker is not None]


_pool: _Pool | None = None


def _current_pool() -> _Pool:
    global _pool
    loop = asyncio.get_running_loop()
    pool = _pool
    if pool is None or pool.loop is not loop:
        # A new event loop (tests run one per test): the old loop's pool cannot be
        # waited on from this one; its workers are ended, not waited for.
        if pool is not None:
            pool.executor.shutdown(wait=False)
            for slot in pool.slots:
                if slot.worker is not None:
                    slot.worker.kill()
        pool = _pool = _Pool(loop)
    return pool


def stop() -> None:
    """Stop the workers, if there are any (the next large body starts others)."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        pool.stop()


atexit.register(stop)


def _forget_after_fork() -> None:
    # A forked child (a sidecar worker process) starts its own workers: the parent's
    # pipes, threads and event loop are the parent's.
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_after_fork)


def worker_pids() -> list[int]:
    """The running worker processes' ids."""
    pool = _pool
    return pool.pids() if pool is not None else []


def _from_frame(frame: bytes) -> Transcoded:
    if frame[:1] == b"E":
        code = worker.CODE.unpack_from(frame, 1)[0]
        raise ProtobufError(code, frame[1 + worker.CODE.size :].decode())
    size = worker.KIND.unpack_from(frame, 1)[0]
    start = 1 + worker.KIND.size
    return Transcoded(frame[start : start + size].decode(), frame[start + size :])


async def transcode_request(body: bytes, max_json_bytes: int, tenant: str) -> Transcoded:
    """`codec.transcode`, in place when cheap and otherwise in a worker, in `tenant`'s
    turn (the caller's tenant: its share of the workers)."""
    if len(body) <= INLINE_MAX_BYTES:
        decoded = decode(body)
        if count_parts(decoded, INLINE_MAX_PARTS) <= INLINE_MAX_PARTS:
            COUNTS.inline += 1
            return finish(decoded, max_json_bytes)
    COUNTS.worker += 1
    try:
        frame = await _current_pool().convert(tenant, body, max_json_bytes)
    except _WorkerGone:
        raise StatusError(
            503,
            "the protobuf decoder stopped (or could not start) while reading this body; try again",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None
    return _from_frame(frame)

"""Large protobuf bodies are transcoded in a worker process, never on the event loop.

Decoding is C code (upb) that holds the GIL: in a thread it would stop the event loop
as surely as on it (a 3 MiB body of 1.5M entries is 40 to 130 ms of upb alone, and its
conversion seconds of Python). So a body of at most `INLINE_MAX_BYTES` is read in place
(at most about a thousand entries: a millisecond or two at worst, far less for what
kubectl sends), and a larger one goes to a worker process (worker.py), started on the
first large body and replaced every `_TASKS_PER_WORKER` bodies, so that memory a large
decode took is given back. A thread of the default executor talks to it over pipes,
one body at a time; the event loop only waits. DESIGN §10: "no conversion holds the
event loop for more than a few milliseconds".
"""

from __future__ import annotations

import asyncio
import atexit
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

from sidecar.errors import StatusError
from sidecar.kube_protobuf import worker
from sidecar.kube_protobuf.codec import ProtobufError, Transcoded, transcode

INLINE_MAX_BYTES = 2048
_TASKS_PER_WORKER = 32


@dataclass
class Counts:
    """Bodies transcoded in place and in the worker, in this process."""

    inline: int = 0
    worker: int = 0


COUNTS = Counts()


class _WorkerGone(Exception):
    pass


class _Worker:
    """The worker process, used by one thread at a time (`_LOCK`)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar.kube_protobuf"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.tasks = 0

    def exchange(self, body: bytes, max_json_bytes: int) -> bytes:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        self.tasks += 1
        try:
            stdin.write(worker.REQUEST.pack(len(body), max_json_bytes))
            stdin.write(body)
            stdin.flush()
        except (BrokenPipeError, OSError):
            raise _WorkerGone from None
        header = worker.read_exact(stdout, worker.LENGTH.size)  # type: ignore[arg-type]
        frame = None
        if header is not None:
            frame = worker.read_exact(stdout, worker.LENGTH.unpack(header)[0])  # type: ignore[arg-type]
        if frame is None:
            raise _WorkerGone
        return frame

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


_LOCK = threading.Lock()
_worker: _Worker | None = None


def _run(body: bytes, max_json_bytes: int) -> bytes:
    """In a thread: one body through the worker (started or replaced as needed)."""
    global _worker
    with _LOCK:
        if _worker is None:
            _worker = _Worker()
        current = _worker
        try:
            return current.exchange(body, max_json_bytes)
        except _WorkerGone:
            _worker = None
            current.stop()
            raise
        finally:
            if _worker is current and current.tasks >= _TASKS_PER_WORKER:
                _worker = None
                current.stop()


def stop() -> None:
    """Stop the worker, if there is one (the next large body starts another)."""
    global _worker
    with _LOCK:
        current, _worker = _worker, None
    if current is not None:
        current.stop()


atexit.register(stop)


def _forget_after_fork() -> None:
    # A forked child (a sidecar worker process) starts its own worker: the parent's pipes
    # and lock are the parent's.
    global _LOCK, _worker
    _LOCK, _worker = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_after_fork)


def worker_pid() -> int | None:
    """The worker's process id (None while there is none)."""
    current = _worker
    return current.proc.pid if current is not None else None


def _decode(frame: bytes) -> Transcoded:
    if frame[:1] == b"E":
        code = worker.CODE.unpack_from(frame, 1)[0]
        raise ProtobufError(code, frame[1 + worker.CODE.size :].decode())
    size = worker.KIND.unpack_from(frame, 1)[0]
    start = 1 + worker.KIND.size
    return Transcoded(frame[start : start + size].decode(), frame[start + size :])


async def transcode_request(body: bytes, max_json_bytes: int) -> Transcoded:
    """`codec.transcode`, in place for a small body and in the worker for a large one."""
    if len(body) <= INLINE_MAX_BYTES:
        COUNTS.inline += 1
        return transcode(body, max_json_bytes)
    COUNTS.worker += 1
    try:
        frame = await asyncio.to_thread(_run, body, max_json_bytes)
    except _WorkerGone:
        raise StatusError(
            503, "the protobuf decoder stopped while reading this body; try again"
        ) from None
    return _decode(frame)

"""A protobuf worker that is slow on demand (the fault, for the offload tests): the real
worker (sidecar/services/codecs/kube_protobuf/worker.py), except that before answering a body it waits
until the test opens that body's gate, the FIFO `GATES/<metadata.name>`.

    python -m tests.rigs.gated_worker GATES

`open_gate(gates, name)` (in the test) succeeds once a worker waits at that gate, and
lets it answer: so it both says "this body is in a worker now" and releases it.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from sidecar.services.codecs.kube_protobuf import codec, worker
from sidecar.services.codecs.kube_protobuf.descriptors import CLASSES


def command(gates: Path) -> list[str]:
    """The command line of a worker gated by the FIFOs under `gates`."""
    return [sys.executable, "-m", "tests.rigs.gated_worker", str(gates)]


def make_gates(gates: Path, names: list[str]) -> None:
    gates.mkdir(exist_ok=True)
    for name in names:
        os.mkfifo(gates / name)


def open_gate(gates: Path, name: str) -> bool:
    """Release the worker waiting at `name`'s gate; False while none waits there."""
    try:
        fd = os.open(gates / name, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet: no worker has reached this body
            return False
        raise
    os.close(fd)  # the worker reads the end of the FIFO and answers
    return True


def _name(body: bytes) -> str:
    found, raw = codec.decode_envelope(body)[2:]
    obj = CLASSES[found.message]()
    obj.ParseFromString(raw)
    return str(obj.metadata.name.decode())


def main(gates: str) -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = worker.read_exact(stdin, worker.REQUEST.size)
        if header is None:
            return
        length, max_json_bytes = worker.REQUEST.unpack(header)
        body = worker.read_exact(stdin, length)
        if body is None:
            return
        name = _name(body)
        with open(os.path.join(gates, name), "rb") as gate:  # blocks until opened
            gate.read()
        frame = worker.answer(body, max_json_bytes)
        stdout.write(worker.LENGTH.pack(len(frame)) + frame)
        stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])

"""The protobuf worker process (`python -m sidecar.services.codecs.kube_protobuf`, see __main__.py).

Reads requests from stdin and writes answers to stdout, one at a time, until stdin
closes (so it ends with the sidecar that started it, however that one ends):

    request:  >I body length, >Q max JSON bytes, the body
    answer:   >I frame length, then b"K" >I kind length, kind, JSON bytes
                                  or b"E" >H status code, message (UTF-8)
"""

from __future__ import annotations

import os
import struct
import sys
from typing import BinaryIO

from sidecar.core.status import StatusError
from sidecar.services.codecs.kube_protobuf.codec import transcode

REQUEST = struct.Struct(">IQ")
LENGTH = struct.Struct(">I")
KIND = struct.Struct(">I")
CODE = struct.Struct(">H")


def read_exact(stream: BinaryIO, size: int) -> bytes | None:
    """`size` bytes, or None at the end of the stream."""
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def answer(body: bytes, max_json_bytes: int) -> bytes:
    try:
        result = transcode(body, max_json_bytes)
    except StatusError as exc:
        return b"E" + CODE.pack(exc.code) + exc.message.encode()
    kind = result.kind.encode()
    return b"K" + KIND.pack(len(kind)) + kind + result.data


def main() -> None:
    # Below the sidecar's own priority: on a busy machine, requests come first.
    os.nice(10)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = read_exact(stdin, REQUEST.size)
        if header is None:
            return
        length, max_json_bytes = REQUEST.unpack(header)
        body = read_exact(stdin, length)
        if body is None:
            return
        frame = answer(body, max_json_bytes)
        stdout.write(LENGTH.pack(len(frame)) + frame)
        stdout.flush()

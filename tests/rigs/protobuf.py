"""A tiny protobuf wire encoder for hand-made Kubernetes protobuf bodies, independent of
sidecar/kube_protobuf.py's descriptors: fields kubectl does not send, and bad input."""

from __future__ import annotations

from sidecar.kube_protobuf import MAGIC


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(field << 3 | 2) + varint(len(data)) + data


def vi(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value)


def entry(field: int, key: str, value: bytes | str) -> bytes:
    return ld(field, ld(1, key) + ld(2, value))


def envelope(api_version: str, kind: str, raw: bytes, encoding: str = "", ctype: str = "") -> bytes:
    return (
        MAGIC
        + ld(1, ld(1, api_version) + ld(2, kind))
        + ld(2, raw)
        + ld(3, encoding)
        + ld(4, ctype)
    )


def meta(*fields: bytes) -> bytes:
    # Like Go: every non-pointer field written, zero or not, then the given ones.
    zeros = (
        ld(1, "")
        + ld(2, "")
        + ld(3, "")
        + ld(4, "")
        + ld(5, "")
        + ld(6, "")
        + vi(7, 0)
        + ld(8, b"")
    )
    return ld(1, zeros + b"".join(fields))


def pod_body() -> bytes:
    container = ld(1, "c") + ld(2, "nginx")
    return envelope("v1", "Pod", meta(ld(1, "p"), ld(3, "ns1")) + ld(2, ld(2, container)))

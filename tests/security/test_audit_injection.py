"""Audit-record splitting (DESIGN §9): a record is always exactly one line, whatever
bytes a name holds. Log shippers (and `str.splitlines`) break lines on U+2028, U+2029
and U+0085 as well as on ASCII controls; a record carrying one raw splits in two and
lets a client forge the second half. Real sidecar and backing store processes; the
names travel raw in the request target, in the query, in the trusted front-proxy
headers and in JWT claims."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.rigs import processes, tenancy
from tests.rigs.tokens import SECRET, hs256
from tests.rigs.waiting import eventually

# Every character Python's splitlines() (and common shippers) treat as a line break,
# minus \n itself, which no HTTP parser lets through raw.
SEPARATORS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
# Raw in a header value only what an HTTP parser passes on: bytes >= 0x80. (Raw in
# the request target, aiohttp's parser refuses them with 400 before the pipeline.)
RAW_SAFE = ["\x85", "\u2028", "\u2029"]


async def raw_request(
    port: int, request_id: str, target: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> int:
    """Send one request with `target` and header values as raw bytes; the status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        head += b"X-Request-Id: " + request_id.encode() + b"\r\n"
        for name, value in headers:
            head += name + b": " + value + b"\r\n"
        writer.write(head + b"\r\n")
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        await asyncio.wait_for(reader.read(), 10)
        return int(status_line.split()[1])
    finally:
        writer.close()


def audit_lines(path: Path) -> list[str]:
    """The audit file split the way a shipper splits it (none yet: no lines)."""
    try:
        return path.read_bytes().decode("utf-8").splitlines()
    except FileNotFoundError:
        return []


async def wait_for_records(path: Path, ids: set[str], limit: float = 10.0) -> list[dict[str, Any]]:
    """The audit records once every id in `ids` has one (or whatever is there at `limit`)."""

    def records() -> list[dict[str, Any]]:
        out = []
        for line in audit_lines(path):
            try:
                out.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"an audit line is not one JSON record: {line!r}") from None
        return out

    def complete() -> list[dict[str, Any]] | None:
        found = records()
        return found if ids <= {r.get("requestId") for r in found} else None

    with contextlib.suppress(AssertionError):
        return await eventually(complete, limit)
    return records()


async def test_every_record_is_one_line(tmp_path: Path) -> None:
    async with tenancy.running(
        tmp_path,
        identity={
            "tokenFile": str(processes.write_tokens(tmp_path, tenancy.TOKENS)),
            "jwt": {"secret": SECRET, "algorithms": ["HS256"]},
            "trustedHeaders": {"enabled": True, "clients": ["127.0.0.1"]},
        },
    ) as env:
        port = int(env.url.rsplit(":", 1)[1])
        audit = tmp_path / f"sidecar-{port}-audit.log"
        sent: dict[str, int] = {}
        n = 0

        def rid() -> str:
            nonlocal n
            n += 1
            return f"audit-{n}"

        for sep in RAW_SAFE:
            raw = sep.encode("utf-8")
            # Raw UTF-8 in the front proxy's user, group and tenant headers.
            i = rid()
            sent[i] = await raw_request(
                port,
                i,
                b"/api/v1/namespaces/default/configmaps",
                [
                    (b"X-Remote-User", b"eve" + raw + b'{"user":"admin"}'),
                    (b"X-Remote-Group", b"g" + raw + b"x"),
                    (b"X-Remote-Tenant", b"acme"),
                ],
            )
            i = rid()
            sent[i] = await raw_request(
                port,
                i,
                b"/api/v1/namespaces/default/configmaps",
                [
                    (b"X-Remote-User", b"eve"),
                    (b"X-Remote-Group", b"g" + raw + b"x"),
                    (b"X-Remote-Tenant", b"ac" + raw + b"me"),
                ],
            )
        for sep in SEPARATORS:
            # Percent-encoded in the path, and inside JWT claims (any character).
            i = rid()
            sent[i] = await raw_request(
                port,
                i,
                b"/api/v1/namespaces/default/configmaps/a%"
                + f"{ord(sep):02X}".encode()
                + b"b?x=%E2%80%A8",
                [(b"Authorization", b"Bearer acme-admin")],
            )
            token = hs256(
                {
                    "sub": f"mallory{sep}x",
                    "tenant": "acme",
                    "groups": [f"g{sep}1", "users"],
                    "exp": int(time.time()) + 600,
                }
            )
            i = rid()
            sent[i] = await raw_request(
                port,
                i,
                b"/api/v1/namespaces/default/configmaps",
                [(b"Authorization", f"Bearer {token}".encode())],
            )

        assert all(status < 500 for status in sent.values()), sent
        records = await wait_for_records(audit, set(sent))
        ids = [r.get("requestId") for r in records]
        for i in sent:
            assert ids.count(i) == 1, (i, ids.count(i))
        # No record was split: as many lines as records, whatever splits them.
        assert len(audit_lines(audit)) == len(records)
        assert audit.read_bytes().count(b"\n") == len(records)


def test_encoder_escapes_every_line_separator() -> None:
    """The encoder itself, whatever a stage puts in a record (names, reasons, extras)."""
    from sidecar.services.audit import encode

    for sep in [*SEPARATORS, "\n", "\ud800", "\x00"]:
        record = {
            "user": f"a{sep}b",
            "path": f"/x{sep}",
            "reason": sep,
            "extra": {f"k{sep}": [sep]},
        }
        line = encode(record)
        assert line.endswith("\n"), repr(sep)
        assert len(line.splitlines()) == 1, repr(sep)
        assert json.loads(line) == record

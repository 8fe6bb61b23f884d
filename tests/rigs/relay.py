"""A recording TCP relay between the sidecar and its upstream: every connection the
sidecar opens is counted (open and closed) and the request bytes it carried are kept, so
a test can tell which upstream connections are still held and by what.

A connection whose request bytes contain a `stall` marker is swallowed: the relay
forwards nothing more in either direction, as an upstream that accepted a request and
never answers (it acts on nothing, so a stalled create creates nothing). It stays open
until the sidecar closes its end.

`hold(marker)` holds a request instead, until `let_go()`: a connection whose request
bytes contain the marker forwards nothing more upstream until then (an upstream that is
slow to answer), and then carries on as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class Link:
    """One connection from the sidecar, relayed to the upstream."""

    number: int
    sent: bytearray = field(default_factory=bytearray)
    stalled: bool = False
    closed: bool = False

    def carried(self, marker: bytes) -> bool:
        return marker in self.sent


class RecordingRelay:
    def __init__(self, target_port: int, stall_marker: bytes = b"stall") -> None:
        self.target_port = target_port
        self.stall_marker = stall_marker
        self.links: list[Link] = []
        self.hold_marker: bytes | None = None
        self._gate = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self, marker: bytes) -> None:
        """Hold every request carrying `marker` (forward nothing more) until `let_go()`."""
        self.hold_marker = marker
        self._gate.clear()

    def let_go(self) -> None:
        self._gate.set()

    def open_links(self) -> list[Link]:
        return [link for link in self.links if not link.closed]

    def requests_with(self, marker: bytes) -> int:
        """How many requests (request lines) carrying `marker` reached the relay."""
        count = 0
        for link in self.links:
            for line in bytes(link.sent).split(b"\r\n"):
                if b" HTTP/1.1" in line and marker in line:
                    count += 1
        return count

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(len(self.links))
        self.links.append(link)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            link.closed = True
            writer.close()
            return
        self._writers.add(up_writer)

        async def downstream() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await reader.read(65536):
                    link.sent += data
                    if self.stall_marker in link.sent:
                        link.stalled = True
                    held = self.hold_marker
                    if held is not None and held in link.sent and not self._gate.is_set():
                        await self._gate.wait()
                    if not link.stalled:
                        up_writer.write(data)
                        await up_writer.drain()
            link.closed = True  # the sidecar closed its end

        async def upstream() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await up_reader.read(65536):
                    if not link.stalled:
                        writer.write(data)
                        await writer.drain()

        down = asyncio.ensure_future(downstream())
        up = asyncio.ensure_future(upstream())
        try:
            # The sidecar's end decides: once it closes, so does the upstream's.
            await asyncio.wait([down, up], return_when=asyncio.FIRST_COMPLETED)
            if up.done() and not down.done():  # the upstream closed: pass it on
                writer.close()
                await down
        finally:
            link.closed = True
            for task in (down, up):
                task.cancel()
            for w in (writer, up_writer):
                w.close()
            self._writers.discard(writer)
            self._writers.discard(up_writer)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        self._writers.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

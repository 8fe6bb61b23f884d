"""A TCP forwarder to the real Redis that a test owns and can cut, to simulate Redis going
away without ever stopping the shared Redis server."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit


class Forwarder:
    """A TCP forwarder to Redis that the test can cut, to simulate Redis stopping."""

    def __init__(self, redis_url: str) -> None:
        """`redis_url`: the shared Redis (the `redis_url` fixture), wherever it runs."""
        self.target = urlsplit(redis_url)
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """`redis_url` with the forwarder's address in place of the server's (started)."""
        netloc = self.target.netloc.rpartition("@")
        address = f"127.0.0.1:{self.port}"
        return urlunsplit(self.target._replace(netloc=netloc[0] + netloc[1] + address))

    async def start(self, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.target.hostname or "127.0.0.1", self.target.port or 6379
        up_reader, up_writer = await asyncio.open_connection(host, port)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in list(self.writers):
            w.close()
        self.writers.clear()
        await self.server.wait_closed()

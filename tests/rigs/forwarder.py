"""A TCP forwarder to the real Redis that a test owns and can cut, to simulate Redis going
away without ever stopping the shared Redis server."""

from __future__ import annotations

import asyncio


class Forwarder:
    """A TCP forwarder to Redis that the test can cut, to simulate Redis stopping."""

    def __init__(self, target_port: int = 6379) -> None:
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
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

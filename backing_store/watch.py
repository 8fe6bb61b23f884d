"""Watch streams: newline-delimited JSON events `{"type", "object"}` for changes made
after the watch started. The storage calls `Hub.publish` after each commit; every
watcher has a bounded queue, and one that falls too far behind is closed (as a
Kubernetes API server closes a slow watch) rather than slowing writers down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

QUEUE_SIZE = 10_000
_CLOSE = None

Predicate = Callable[[str, dict[str, Any]], bool]


class Watcher:
    def __init__(self, wants: Predicate) -> None:
        self.wants = wants
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(QUEUE_SIZE)


class Hub:
    def __init__(self) -> None:
        self.watchers: set[Watcher] = set()

    def publish(self, kind: str, key: str, obj: dict[str, Any]) -> None:
        line: str | None = None
        for w in list(self.watchers):
            if not w.wants(key, obj):
                continue
            if line is None:
                line = json.dumps({"type": kind, "object": obj}, separators=(",", ":")) + "\n"
            try:
                w.queue.put_nowait(line)
            except asyncio.QueueFull:
                self.watchers.discard(w)
                with contextlib.suppress(asyncio.QueueFull):
                    w.queue.get_nowait()
                    w.queue.put_nowait(_CLOSE)

    def close_all(self) -> None:
        for w in list(self.watchers):
            self.watchers.discard(w)
            with contextlib.suppress(asyncio.QueueFull):
                w.queue.put_nowait(_CLOSE)

    async def stream(
        self, request: web.Request, wants: Predicate, seconds: float | None
    ) -> web.StreamResponse:
        """Serve one watch until the client leaves, the timeout ends it, or shutdown."""
        watcher = Watcher(wants)
        self.watchers.add(watcher)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            loop = asyncio.get_running_loop()
            deadline = None if seconds is None else loop.time() + seconds
            while True:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    line = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    break
                if line is _CLOSE:
                    break
                await resp.write(line.encode())
        except ConnectionResetError:
            return resp
        finally:
            self.watchers.discard(watcher)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

"""Watch streams: newline-delimited JSON events `{"type", "object"}` for changes made
after the watch started. The storage calls `Hub.publish` after each commit; every
watcher has a bounded queue, and one that falls too far behind is closed (as a
Kubernetes API server closes a slow watch) rather than slowing writers down.

A watch with a filter (selectors, owner, tags) sees what a Kubernetes watch sees when
an update moves an object across the filter: `ADDED` when it starts to match,
`DELETED` (with the object's new state) when it stops, `MODIFIED` while it matches.
A watcher with a `render` function writes its own event lines (a `Table` per event for
`kubectl get --watch`); the others share one line per event type.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

QUEUE_SIZE = 10_000
CLIENT_CHECK_SECONDS = 1.0
_CLOSE = None

Predicate = Callable[[str, dict[str, Any]], bool]
# (event type, object) -> the event's line, newline included
Render = Callable[[str, dict[str, Any]], str]


def event_line(event: str, obj: dict[str, Any]) -> str:
    return json.dumps({"type": event, "object": obj}, separators=(",", ":")) + "\n"


class Watcher:
    def __init__(self, wants: Predicate, render: Render | None = None) -> None:
        self.wants = wants
        self.render = render
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(QUEUE_SIZE)


def _event_for(
    wants: Predicate, kind: str, key: str, obj: dict[str, Any], old: dict[str, Any] | None
) -> str | None:
    """The event type this watcher sees for a change, or None when it sees nothing."""
    now = wants(key, obj)
    if kind != "MODIFIED" or old is None:
        return kind if now else None
    before = wants(key, old)
    if now:
        return "MODIFIED" if before else "ADDED"
    return "DELETED" if before else None


class Hub:
    def __init__(self) -> None:
        self.watchers: set[Watcher] = set()

    def publish(
        self, kind: str, key: str, obj: dict[str, Any], old: dict[str, Any] | None = None
    ) -> None:
        lines: dict[str, str] = {}
        for w in list(self.watchers):
            event = _event_for(w.wants, kind, key, obj, old)
            if event is None:
                continue
            if w.render is not None:
                line = w.render(event, obj)
            else:
                if event not in lines:
                    lines[event] = event_line(event, obj)
                line = lines[event]
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
        self,
        request: web.Request,
        wants: Predicate,
        seconds: float | None,
        initial: list[str] | None = None,
        render: Render | None = None,
    ) -> web.StreamResponse:
        """Serve one watch until the client leaves, the timeout ends it, or shutdown.

        `initial` lines (events for the current state) go out before any change."""
        watcher = Watcher(wants, render)
        self.watchers.add(watcher)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            for event in initial or ():
                await resp.write(event.encode())
            loop = asyncio.get_running_loop()
            deadline = None if seconds is None else loop.time() + seconds
            while True:
                # A watch with no events still notices its client leaving: it wakes up
                # every CLIENT_CHECK_SECONDS to look at the connection.
                wait = CLIENT_CHECK_SECONDS
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - loop.time()))
                try:
                    line = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    transport = request.transport
                    if transport is None or transport.is_closing():
                        break
                    if deadline is not None and loop.time() >= deadline:
                        break
                    continue
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

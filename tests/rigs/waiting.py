"""Waiting on a condition, never on the clock: `eventually` polls a condition until it
holds or a deadline passes, and says what it waited for when it fails. Both variants
below are the only places in tests/ that sleep to synchronise (the polling interval)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

INTERVAL = 0.02


@overload
async def eventually(
    condition: Callable[[], Awaitable[T | None]], within: float = ..., what: str = ...
) -> T: ...
@overload
async def eventually(
    condition: Callable[[], T | None], within: float = ..., what: str = ...
) -> T: ...
async def eventually(condition: Callable[[], Any], within: float = 10.0, what: str = "") -> Any:
    """Await until `condition()` (a function or a coroutine function) returns something
    truthy (so never None), and return it; AssertionError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {within} s: {what or condition}")
        await asyncio.sleep(INTERVAL)  # the polling interval


def eventually_sync(condition: Callable[[], T | None], within: float = 10.0, what: str = "") -> T:
    """`eventually` for code outside an event loop (threads, plain sync tests)."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {within} s: {what or condition}")
        time.sleep(INTERVAL)  # the polling interval

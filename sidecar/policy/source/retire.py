"""Freeing a replaced policy bundle a piece at a time, off the event loop.

Dropping the last reference to a large bundle frees its whole object tree in one
deallocation cascade, and a cascade never releases the GIL: at 100k policy lines that
stalls the event loop for tens of ms, whichever thread drops it. `dismantle` instead
empties the bundle's containers item by item from a worker thread, so the GIL can pass
to the event loop between items.

It only ever empties what the bundle owns alone: a container or object that anything
else still refers to (the bundle in force, a request in flight, a module constant) is
left untouched, and reference counting frees it when its last holder lets go.
"""

from __future__ import annotations

import sys
from typing import Any

# sys.getrefcount counts its own argument and the loop variable holding the object.
_OWN_REFS = 2


def dismantle(holder: list[Any]) -> int:
    """Free the object in `holder` (then empty) piece by piece; returns how many
    containers were emptied. Call from a worker thread.

    An object is taken apart only when the loop variable is its last reference. Its
    parent, owned the same way, was freed when the loop moved on from it, so "the
    last reference" needs no allowance for parents."""
    emptied = 0
    stack: list[Any] = [holder.pop()]
    while stack:
        obj = stack.pop()
        if sys.getrefcount(obj) > _OWN_REFS:
            continue
        if isinstance(obj, dict):
            while obj:
                stack.append(obj.popitem()[1])
            emptied += 1
        elif isinstance(obj, (list, set)):
            while obj:
                stack.append(obj.pop())
            emptied += 1
        elif isinstance(obj, tuple):
            stack.extend(obj)
        elif type(obj).__module__.startswith("sidecar."):
            stack.extend(_attributes(obj))
        # Anything else (strings, numbers, library objects) is freed by refcounting.
    return emptied


def _attributes(obj: Any) -> list[Any]:
    values: list[Any] = []
    if hasattr(obj, "__dict__"):
        values.extend(vars(obj).values())
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                values.append(getattr(obj, name))
    return values

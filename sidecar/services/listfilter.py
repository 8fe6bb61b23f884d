"""Owner-filtered lists, filtered as they stream (DESIGN §8, §11).

Owns reading an upstream list answer a piece at a time and writing out the same
document with only the items (and Table rows) the caller may see: `ListStream`. It
knows nothing of owners: the rule for one item or row comes from
`sidecar.policy.owner.OwnerListFilter`; the proxy (`Upstream._owner_list`) feeds it
the answer's bytes and decides when they go out.

The answer is tokenised by ijson (the yajl2 C backend where installed) and every
element of the top-level `items` and `rows` arrays is built by ijson's C object
builder, handed over one at a time, kept or dropped, and encoded at once; nothing but
the element being built, and the fields around the arrays, is held. What comes out:

- `{`, the answer's top-level fields in their order, each array with only its kept
  elements (re-encoded: what was checked is what is sent), `}`; numbers keep their
  value (integers exactly, decimals as the nearest double).
- Nothing before the first array has started: an answer that is not an object, or an
  object with no `items` or `rows` array, becomes an empty `List`, never its own
  fields (they could be an object the caller may not see). An `items`/`rows` value
  that is not an array (`null`, an object) has no elements: it is written as `[]`,
  and does not make the answer a list.
- Invalid JSON, a document that ends early or carries anything after its end, an
  array named twice, and a part larger than `max_part_bytes` (one element; the fields
  before the first array; or those after an array) raise `BrokenList`: the caller
  answers 502, or cuts the connection when the answer has started.

Each `feed` call does work in proportion to the bytes given, so the proxy bounds the
time one call holds the event loop by the size of the pieces it feeds.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import ijson

# The backend ijson picked (yajl2_c when its C extension is installed, which the
# sidecar's wheels are: see docs/performance.md).
_BACKEND = ijson.get_backend(ijson.backend_name)
# The arrays filtered, and the element rule each takes ("item" or "row").
ARRAYS = {"items": "item", "rows": "row"}
EMPTY_LIST = b'{"kind":"List","apiVersion":"v1","metadata":{},"items":[]}'

Rule = Callable[[Any], Any]


class BrokenList(Exception):
    """The answer is not one complete JSON document, or a part of it is too large."""


def _number(value: object) -> float:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


# Compact, ASCII-only (always valid UTF-8), and no NaN or Infinity (a decimal too large
# for a double is refused, not turned into invalid JSON).
_ENCODE = json.JSONEncoder(
    separators=(",", ":"), allow_nan=False, default=_number, check_circular=False
).encode


def encode(value: Any) -> bytes:
    try:
        return _ENCODE(value).encode()
    except (ValueError, OverflowError, TypeError) as exc:
        raise BrokenList(f"a value cannot be encoded as JSON: {exc}") from None


class ListStream:
    """One answer's filter: `feed(bytes)` as they arrive, then `finish()`; each returns
    the output bytes ready so far (possibly empty)."""

    def __init__(self, item: Rule, row: Rule, max_part_bytes: int) -> None:
        self._rules = {"item": item, "row": row}
        self._max_part = max_part_bytes
        self._part = 0  # bytes fed since the last element or array boundary
        self._out: list[bytes] = []
        self._held: list[bytes] = []  # the fields before the first array
        self._started = False  # the first array has begun: output may go out
        self._not_a_list = False
        self._depth = 0  # within the top-level object: 0 before it, 1 at its keys
        self._key = ""
        self._value: ijson.ObjectBuilder | None = None
        self._value_depth = 0
        self._skip_depth = 0
        self._seen: set[str] = set()
        self._arrays: set[str] = set()
        self._array = ""  # the array being filtered, "" outside one
        self._array_first = True
        self._elements: Any = None  # ijson's C builder of the current array's elements
        self._send_element: Callable[[Any], None] = _nothing
        self._ended = False
        self._events = _BACKEND.parse_coro(_Events(self._event))

    # -- the caller's side -----------------------------------------------------------

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""  # ijson reads an empty piece as the end of the input
        self._part += len(data)
        try:
            self._events.send(data)
        except ijson.JSONError as exc:
            raise BrokenList(f"invalid JSON: {_first_line(exc)}") from None
        if self._part > self._max_part:
            raise BrokenList(
                f"a part of the list is larger than {self._max_part} bytes (one item, "
                "or the fields around the items)"
            )
        return self._take()

    def finish(self) -> bytes:
        """The rest of the output; BrokenList when the document is not complete."""
        try:
            self._events.close()
        except ijson.JSONError as exc:
            raise BrokenList(f"invalid JSON: {_first_line(exc)}") from None
        if not self._ended:
            raise BrokenList("the document ended early")
        if not self._started:
            return EMPTY_LIST
        return self._take()

    @property
    def arrays(self) -> frozenset[str]:
        """The filtered arrays (`items`, `rows`) the document has had as arrays so far
        (one given as `null` or another value is not among them)."""
        return frozenset(self._arrays)

    def _take(self) -> bytes:
        if not self._started or not self._out:
            return b""
        out = b"".join(self._out)
        self._out.clear()
        return out

    # -- parse events ------------------------------------------------------------------

    def _event(self, event: tuple[str, str, Any]) -> None:
        if self._array:  # the hot path: every event inside a filtered array
            if event[1] != "end_array" or event[0] != self._array:
                self._send_element(event)
            else:
                self._end_array()
            return
        self._structure(event)

    def _structure(self, event: tuple[str, str, Any]) -> None:
        """An event outside the filtered arrays."""
        _prefix, kind, value = event
        if self._not_a_list:
            if kind in ("start_map", "start_array"):
                self._depth += 1
            elif kind in ("end_map", "end_array"):
                self._depth -= 1
            self._ended = self._depth == 0
            return
        if self._value is not None:
            self._build(kind, value)
            return
        if self._skip_depth:
            if kind in ("start_map", "start_array"):
                self._skip_depth += 1
            elif kind in ("end_map", "end_array"):
                self._skip_depth -= 1
            return
        if self._depth == 0:  # the document's first event
            if kind == "start_map":
                self._depth = 1
                return
            self._not_a_list = True
            if kind in ("start_map", "start_array"):
                self._depth = 1
            else:
                self._ended = True
            return
        if kind == "end_map":  # the end of the top-level object
            self._depth = 0
            self._ended = True
            if self._started:
                self._out.append(b"}")
            return
        if kind == "map_key":
            self._key = value
            return
        key = self._key
        if key in ARRAYS:
            if key in self._seen:
                raise BrokenList(f"the list has more than one {key!r}")
            self._seen.add(key)
            if kind == "start_array":
                self._arrays.add(key)
                self._open()
                self._start_array(key)
                return
            # null, or not an array: no elements, and no list unless an array comes.
            self._field(key, b"[]")
            if kind == "start_map":
                self._skip_depth = 1
            return
        if kind in ("start_map", "start_array"):
            self._value = ijson.ObjectBuilder()
            self._value_depth = 0
            self._build(kind, value)
            return
        self._field(key, encode(value))

    def _build(self, kind: str, value: Any) -> None:
        """A top-level field's container value, one event at a time."""
        assert self._value is not None
        self._value.event(kind, value)
        if kind in ("start_map", "start_array"):
            self._value_depth += 1
        elif kind in ("end_map", "end_array"):
            self._value_depth -= 1
            if self._value_depth == 0:
                built, self._value = self._value.value, None
                self._field(self._key, encode(built))

    def _field(self, key: str, value: bytes) -> None:
        """A top-level field other than a filtered array, in its place."""
        piece = encode(key) + b":" + value
        if not self._started:
            self._held.append(piece)
            return
        self._out.append(b"," + piece)
        self._part = 0

    def _open(self) -> None:
        """Before a filtered array: the document's start and the fields held until now,
        or the comma after the previous field."""
        if self._started:
            self._out.append(b",")
            return
        self._started = True
        self._out.append(b"{" + b"".join(p + b"," for p in self._held))
        self._held.clear()

    def _start_array(self, key: str) -> None:
        self._out.append(encode(key) + b":[")
        rule = self._rules[ARRAYS[key]]
        self._array = key
        self._array_first = True
        self._elements = _BACKEND.items_basecoro(_Events(self._element(rule)), f"{key}.item")
        self._send_element = self._elements.send
        self._part = 0

    def _element(self, rule: Rule) -> Callable[[Any], None]:
        out = self._out

        def element(value: Any) -> None:
            self._part = 0
            kept = rule(value)
            if kept is None:
                return
            if self._array_first:
                self._array_first = False
                out.append(encode(kept))
            else:
                out.append(b"," + encode(kept))

        return element

    def _end_array(self) -> None:
        self._out.append(b"]")
        self._array = ""
        self._elements, self._send_element = None, _nothing
        self._part = 0


def _nothing(_event: Any) -> None:
    pass


class _Events:
    """The target ijson's coroutines send to."""

    __slots__ = ("send",)

    def __init__(self, send: Callable[[Any], None]) -> None:
        self.send = send


def _first_line(exc: Exception) -> str:
    """yajl's message without the lines that quote the document (the client of a 502
    must not read the answer it was refused)."""
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).split("\n", 1)[0][:200]


# -- taking turns on the event loop ---------------------------------------------------

# The share of the event loop's time that list filtering may take, over every list of
# every tenant together, measured over windows of LANE_WINDOW seconds: once the pieces
# filtered in a window took LANE_SHARE of it, the next piece waits for the next window,
# and every other callback (other tenants' requests) has the loop to itself until then.
LANE_SHARE = 0.35
LANE_WINDOW = 0.01


class FilterLane:
    """Turns at filtering list pieces on one event loop (DESIGN §8, §11): one piece at a
    time across every list being filtered, at least one turn of the event loop between
    two pieces, the tenants waiting served in turn (a tenant with 16 lists gets one
    piece per round, as a tenant with one does), and at most `share` of the loop's time
    in every `window` seconds.

        async with lane.turn(tenant):
            out = stream.feed(piece)

    So one tenant's lists hold the loop for at most one piece at a time and at most
    `share` of it (LANE_SHARE, about a third) over any window, and other requests wait
    at most one piece per turn of the loop while lists are filtered, none while the
    lane rests."""

    def __init__(
        self,
        share: float = LANE_SHARE,
        window: float = LANE_WINDOW,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.share = share
        self.window = window
        self._clock = clock or time.perf_counter
        self._busy = False
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._order: collections.deque[str] = collections.deque()
        self._window_start = 0.0
        self._spent = 0.0
        self._handing = False
        self.rested = 0  # windows the lane waited out (for tests and the docs)

    def turn(self, tenant: str) -> _Turn:
        return _Turn(self, tenant)

    async def _acquire(self, tenant: str) -> None:
        if not self._busy and not self._order and not self._handing:
            self._busy = True
            return
        waiter = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(tenant)
        if queue is None:
            queue = self._waiting[tenant] = collections.deque()
            self._order.append(tenant)
        queue.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(0.0)  # the turn was ours: hand it on
            else:
                self._forget(tenant, waiter)
            raise

    def _forget(self, tenant: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[tenant]
                self._order.remove(tenant)

    def _release(self, spent: float) -> None:
        """A piece took `spent` seconds: the next turn comes after at least one turn of
        the loop, or after the window when this one's share is used up."""
        now = self._clock()
        if now - self._window_start >= self.window:
            self._window_start, self._spent = now, 0.0
        self._spent += spent
        self._busy = False
        # Until `_hand_on` runs, newcomers queue too: a list alone also lets the loop
        # turn (or rest) before its next piece.
        self._handing = True
        loop = asyncio.get_running_loop()
        if self._spent >= self.share * self.window:
            self.rested += 1
            rest = self._window_start + self.window - now
            self._window_start, self._spent = now + max(rest, 0.0), 0.0
            loop.call_later(max(rest, 0.0), self._hand_on)
        else:
            loop.call_soon(self._hand_on)

    def _hand_on(self) -> None:
        """The next tenant in turn gets the lane (its oldest waiting list)."""
        self._handing = False
        while self._order and not self._busy:
            tenant = self._order.popleft()
            queue = self._waiting[tenant]
            waiter = queue.popleft()
            if queue:
                self._order.append(tenant)  # back of the round
            else:
                del self._waiting[tenant]
            if not waiter.done():
                self._busy = True
                waiter.set_result(None)


class _Turn:
    __slots__ = ("_lane", "_started", "_tenant")

    def __init__(self, lane: FilterLane, tenant: str) -> None:
        self._lane = lane
        self._tenant = tenant
        self._started = 0.0

    async def __aenter__(self) -> None:
        await self._lane._acquire(self._tenant)
        self._started = self._lane._clock()

    async def __aexit__(self, *exc: object) -> None:
        lane = self._lane
        lane._release(lane._clock() - self._started)

"""Owner-filtered watches (DESIGN §5 owner rules; issue 29): a caller whose only grant
on a resource is an owner rule (`kubectl get nodes -w` as a node owner) sees the watch
events of the objects its tenant owns, and nothing of the others.

The watch is forwarded like the owner-filtered list (`?owner={tenant}`, and
`includeObject=Object` for a Table), so the upstream sends Kubernetes' filtered-watch
events: `ADDED` when an object starts to match, `MODIFIED` while it does, `DELETED` when
it stops matching (its owner changed away) or is deleted. The proxy streams the answer
through `WatchFilter`, which holds each event to the same rule as a list item, on the
sidecar's side of the boundary (`OwnerListFilter.item` / `.row`):

- an event whose object (or Table row's object) the caller's tenant owns goes out as
  the list would show it (a row carries what the client asked `includeObject` for);
- a `DELETED` event for an object the tenant no longer owns (its owner changed away)
  goes out as a `DELETED` event that says which object left and nothing else: kind,
  apiVersion, and the name, uid and resourceVersion (a Table row: the name, the other
  cells empty). Its new owner, spec and labels are another tenant's and never shown;
- any other event for an object the tenant does not own is dropped;
- `BOOKMARK` events pass with their resourceVersion only; `ERROR` events (a Status)
  pass as they are.

Events are newline-delimited JSON (the watch framing of the API server and of the
reference store). A line that is not a JSON event (an upstream that answered the watch
with a document) is dropped, as the list filter drops what is not a list item: nothing
unchecked goes out. A line longer than `max_line_bytes` raises `BrokenWatch`: the proxy
ends the watch (the client re-watches), never sends the line.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from sidecar.policy.owner import OwnerListFilter

__all__ = ["BrokenWatch", "WatchFilter", "owner_watch"]

_PASS = frozenset({"BOOKMARK", "ERROR"})


class BrokenWatch(Exception):
    """The upstream's watch stream cannot be read as events."""


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


class WatchFilter:
    """One watch answer's filter: `feed(bytes)` as they arrive, then `finish()`; each
    returns the lines to send (possibly empty)."""

    def __init__(self, rule: OwnerListFilter, max_line_bytes: int) -> None:
        self._rule = rule
        self._max = max_line_bytes
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        self._pending += chunk
        out: list[bytes] = []
        while True:
            end = self._pending.find(b"\n")
            if end < 0:
                break
            line = bytes(self._pending[:end])
            del self._pending[: end + 1]
            if line.strip():
                out.append(self._event(line))
        if len(self._pending) > self._max:
            raise BrokenWatch(f"a watch event is longer than {self._max} bytes")
        return b"".join(out)

    def finish(self) -> bytes:
        """The last event, when the stream ended without a newline after it."""
        line, self._pending = bytes(self._pending), bytearray()
        return self._event(line) if line.strip() else b""

    def _event(self, line: bytes) -> bytes:
        try:
            event = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return b""  # not an event: nothing of it goes out
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return b""
        kind, obj = event["type"], event.get("object")
        if kind == "BOOKMARK":  # a resourceVersion, and nothing else of any object
            return _encode({"type": kind, "object": _bookmark(obj)})
        if kind in _PASS:
            return _encode(event)
        if not isinstance(obj, dict):
            return b""
        if obj.get("kind") == "Table" and self._rule.table is not None:
            return self._table_event(kind, obj)
        if self._rule.item(obj) is not None:
            return _encode(event)
        if kind == "DELETED":
            return _encode({"type": kind, "object": _stub(obj)})
        return b""

    def _table_event(self, kind: str, table: dict[str, Any]) -> bytes:
        rows = table.get("rows")
        rows = rows if isinstance(rows, list) else []
        kept = [shown for row in rows if (shown := self._rule.row(row)) is not None]
        if not kept and kind == "DELETED":
            columns = table.get("columnDefinitions")
            kept = [self._stub_row(row, columns) for row in rows if isinstance(row, dict)]
        if not kept:
            return b""
        return _encode({"type": kind, "object": {**table, "rows": kept}})

    def _stub_row(self, row: dict[str, Any], columns: Any) -> dict[str, Any]:
        obj = row.get("object")
        stub = _stub(obj if isinstance(obj, dict) else {})
        name = stub["metadata"].get("name", "")
        names = [c.get("name") if isinstance(c, dict) else None for c in columns or []]
        cells: list[Any] = [name if n == "Name" else "" for n in names] or [name]
        shown: dict[str, Any] = {"cells": cells}
        if self._rule.include == "Object":
            shown["object"] = stub
        elif self._rule.include == "Metadata":
            shown["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": self._rule.table,
                "metadata": stub["metadata"],
            }
        return shown


def _bookmark(obj: Any) -> dict[str, Any]:
    obj = obj if isinstance(obj, dict) else {}
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    out: dict[str, Any] = {k: obj[k] for k in ("kind", "apiVersion") if isinstance(obj.get(k), str)}
    out["metadata"] = {"resourceVersion": version} if isinstance(version, str) else {}
    return out


def _stub(obj: dict[str, Any]) -> dict[str, Any]:
    """Which object left the caller's view, and nothing of what it now is."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    kept = {k: meta[k] for k in ("name", "uid", "resourceVersion") if isinstance(meta.get(k), str)}
    stub: dict[str, Any] = {
        k: obj[k] for k in ("kind", "apiVersion") if isinstance(obj.get(k), str)
    }
    stub["metadata"] = kept
    return stub


class _Context(Protocol):
    owner_list: OwnerListFilter | None


def owner_watch(ctx: _Context, status: int, max_line_bytes: int) -> WatchFilter | None:
    """The filter of a watch answer (the proxy's hook), or None when the watch is not
    owner-filtered or the upstream refused it (an error Status goes out as it is)."""
    if ctx.owner_list is None or not 200 <= status < 300:
        return None
    return WatchFilter(ctx.owner_list, max_line_bytes)

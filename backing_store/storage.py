"""SQLite storage of the reference backing store: objects under Alkaid keys.

One table of objects keyed by `/registry/{plural}/[{tenant}/[{namespace}/]]{name}`
(DESIGN §10), the object's `spec.owner` in its own indexed column, server tags in
their own table, and one global resourceVersion counter (etcd-style: every write
takes the next number). stdlib sqlite3, WAL mode, one connection used inline by the
event loop: calls take microseconds and nothing else shares the connection, so a
`with store.tx():` block is atomic without locks.

Lists are key-range scans (`prefix <= key < prefix-with-'/'-replaced-by-'0'`), paged by
the last key seen, so they stay fast with any number of objects. Listeners get
(type, key, object, previous object) events after each commit; the watch hub is one.

`dryRun=All` is a transaction that rolls back (`with store.tx(dry_run=True):`): every
write path runs for real, constraints included, and then nothing is kept, no
resourceVersion is used up and no event fires. Objects answered from a dry run carry no
new resourceVersion: a create's has none, an update's and a delete's keep the current.
"""

from __future__ import annotations

import base64
import binascii
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .errors import bad_request

Obj = dict[str, Any]
# (event type, key, object, the object before a MODIFIED event or None)
Listener = Callable[[str, str, Obj, Obj | None], None]
# A WHERE fragment over the alias `o` (objects) and its parameters.
Clause = tuple[str, Sequence[object]]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    key   TEXT PRIMARY KEY,
    owner TEXT,
    rv    INTEGER NOT NULL,
    data  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS objects_owner ON objects(owner, key);
CREATE TABLE IF NOT EXISTS tags (
    key TEXT NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (key, tag)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tags_by_tag ON tags(tag, key);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta(name, value) VALUES ('resourceVersion', 0);
"""


def dumps(obj: object) -> str:
    """An object as the JSON the store keeps. A backstop behind the body parsers
    (`bodies.py`): a NaN or infinity that got this far is a 400, never stored."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise bad_request("the object holds a number JSON cannot carry (NaN or infinity)") from None


def range_end(prefix: str) -> str:
    """The first key after every key starting with `prefix` (which ends with '/')."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def owner_of(obj: Obj) -> str | None:
    spec = obj.get("spec")
    owner = spec.get("owner") if isinstance(spec, dict) else None
    return owner if isinstance(owner, str) and owner else None


def encode_continue(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_continue(token: str, prefix: str) -> str:
    """The last key of the previous page; 400 for a token that is not ours."""
    try:
        key = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, ValueError):
        raise bad_request("the continue token is not valid") from None
    if not key.startswith(prefix):
        raise bad_request("the continue token does not belong to this list")
    return key


class _DryRunDone(Exception):
    """Ends a dry-run transaction: rolled back like a failure, but not an error."""


@dataclass(slots=True)
class Page:
    rows: list[str]
    last_key: str | None
    more: bool
    keys: list[str] = field(default_factory=list)


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=OFF")
        self.db.executescript(_SCHEMA)
        row = self.db.execute("SELECT value FROM meta WHERE name='resourceVersion'").fetchone()
        self._rv: int = int(row[0])
        self._depth = 0
        self._tx_rv = self._rv
        self._pending: list[tuple[str, str, Obj, Obj | None]] = []
        self._dry = False
        self.listeners: list[Listener] = []

    def close(self) -> None:
        self.db.close()

    @property
    def resource_version(self) -> int:
        return self._rv

    # -- transactions -------------------------------------------------------------

    @property
    def dry_run(self) -> bool:
        """Inside a `tx(dry_run=True)`: nothing written now will be kept."""
        return self._dry

    @contextmanager
    def tx(self, *, dry_run: bool = False) -> Iterator[None]:
        """Atomic block; nests (only the outermost commits). Events fire after commit.

        `dry_run=True` (outermost only) rolls everything back at the end instead."""
        if self._depth:
            if dry_run and not self._dry:
                raise RuntimeError("a dry-run transaction cannot nest in a real one")
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        self._tx_rv = self._rv
        self._dry = dry_run
        try:
            yield
            if dry_run:
                raise _DryRunDone
            if self._rv != self._tx_rv:
                self.db.execute("UPDATE meta SET value=? WHERE name='resourceVersion'", (self._rv,))
            self.db.execute("COMMIT")
        except BaseException as exc:
            self.db.execute("ROLLBACK")
            self._rv = self._tx_rv
            self._pending.clear()
            if isinstance(exc, _DryRunDone):
                return
            raise
        finally:
            self._depth = 0
            self._dry = False
        events, self._pending = self._pending, []
        for kind, key, obj, old in events:
            for listener in list(self.listeners):
                listener(kind, key, obj, old)

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, kind: str, key: str, obj: Obj, old: Obj | None = None) -> None:
        if self.listeners:
            self._pending.append((kind, key, obj, old))

    # -- reads --------------------------------------------------------------------

    def get_raw(self, key: str) -> str | None:
        row = self.db.execute("SELECT data FROM objects WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def get(self, key: str) -> Obj | None:
        raw = self.get_raw(key)
        if raw is None:
            return None
        obj: Obj = json.loads(raw)
        return obj

    def exists(self, key: str) -> bool:
        return self.db.execute("SELECT 1 FROM objects WHERE key=?", (key,)).fetchone() is not None

    def scan(
        self,
        prefix: str,
        *,
        limit: int | None = None,
        after: str | None = None,
        owner: str | None = None,
        where: Sequence[Clause] = (),
        exact: str | None = None,
    ) -> Page:
        """One page of objects under `prefix`, in key order, after key `after`."""
        sql, params = self._select("o.key, o.data", prefix, after, owner, where, exact)
        sql += " ORDER BY o.key"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit + 1)
        rows = self.db.execute(sql, params).fetchall()
        more = limit is not None and len(rows) > limit
        if more:
            rows = rows[:limit]
        keys = [str(r[0]) for r in rows]
        return Page([str(r[1]) for r in rows], keys[-1] if keys else None, more, keys)

    def count(self, prefix: str, *, owner: str | None = None, where: Sequence[Clause] = ()) -> int:
        sql, params = self._select("count(*)", prefix, None, owner, where, None)
        return int(self.db.execute(sql, params).fetchone()[0])

    def _select(
        self,
        columns: str,
        prefix: str,
        after: str | None,
        owner: str | None,
        where: Sequence[Clause],
        exact: str | None,
    ) -> tuple[str, list[object]]:
        index = "INDEXED BY objects_owner" if owner is not None else ""
        params: list[object] = []
        if exact is not None:
            conds = ["o.key = ?"]
            params.append(exact)
        else:
            conds = ["o.key >= ?", "o.key < ?"]
            params += [prefix if after is None else after, range_end(prefix)]
            if after is not None:
                conds[0] = "o.key > ?"
        if owner is not None:
            conds.append("o.owner = ?")
            params.append(owner)
        for clause, clause_params in where:
            conds.append(clause)
            params.extend(clause_params)
        return f"SELECT {columns} FROM objects o {index} WHERE {' AND '.join(conds)}", params

    def tags(self, key: str) -> list[str]:
        rows = self.db.execute("SELECT tag FROM tags WHERE key=?", (key,)).fetchall()
        return [str(r[0]) for r in rows]

    # -- writes -------------------------------------------------------------------

    def write(self, key: str, obj: Obj, *, create: bool, tags: list[str] | None = None) -> Obj:
        """Insert (create=True) or replace an object; stamps the next resourceVersion.

        `tags` (when not None) replaces the object's rows in the tag table.
        """
        with self.tx():
            old = None if create or not (self.listeners or self._dry) else self.get(key)
            rv = self._next_rv()
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = str(rv)
            data = dumps(obj)
            if create:
                self.db.execute(
                    "INSERT INTO objects(key, owner, rv, data) VALUES (?,?,?,?)",
                    (key, owner_of(obj), rv, data),
                )
            else:
                self.db.execute(
                    "UPDATE objects SET owner=?, rv=?, data=? WHERE key=?",
                    (owner_of(obj), rv, data, key),
                )
            if tags is not None:
                self.db.execute("DELETE FROM tags WHERE key=?", (key,))
                self.db.executemany(
                    "INSERT OR IGNORE INTO tags(key, tag) VALUES (?,?)", [(key, t) for t in tags]
                )
            self._emit("ADDED" if create else "MODIFIED", key, obj, old)
            if self._dry:
                if old is None:
                    meta.pop("resourceVersion", None)
                else:
                    meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        return obj

    def delete(self, key: str) -> Obj | None:
        with self.tx():
            obj = self.get(key)
            if obj is None:
                return None
            self.db.execute("DELETE FROM objects WHERE key=?", (key,))
            self.db.execute("DELETE FROM tags WHERE key=?", (key,))
            rv = str(self._next_rv())
            if not self._dry:
                obj.setdefault("metadata", {})["resourceVersion"] = rv
            self._emit("DELETED", key, obj)
        return obj

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (cascades); returns how many."""
        end = range_end(prefix)
        with self.tx():
            if self.listeners:
                rows = self.db.execute(
                    "SELECT key, data FROM objects WHERE key >= ? AND key < ?", (prefix, end)
                ).fetchall()
                rv = str(self._next_rv())
                for key, raw in rows:
                    obj: Obj = json.loads(raw)
                    obj.setdefault("metadata", {})["resourceVersion"] = rv
                    self._emit("DELETED", str(key), obj)
            cur = self.db.execute("DELETE FROM objects WHERE key >= ? AND key < ?", (prefix, end))
            self.db.execute("DELETE FROM tags WHERE key >= ? AND key < ?", (prefix, end))
            if cur.rowcount:
                self._next_rv()
            return int(cur.rowcount)

    def bulk_insert(self, items: Iterable[tuple[str, Obj, list[str] | None]]) -> int:
        """Seed many objects in one transaction (no events): for load tests and demos."""
        n = 0
        with self.tx():
            rows: list[tuple[str, str | None, int, str]] = []
            tag_rows: list[tuple[str, str]] = []
            for key, obj, tags in items:
                rv = self._next_rv()
                obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
                rows.append((key, owner_of(obj), rv, dumps(obj)))
                if tags:
                    tag_rows.extend((key, t) for t in tags)
                n += 1
            self.db.executemany("INSERT INTO objects(key, owner, rv, data) VALUES (?,?,?,?)", rows)
            self.db.executemany("INSERT OR IGNORE INTO tags(key, tag) VALUES (?,?)", tag_rows)
        return n

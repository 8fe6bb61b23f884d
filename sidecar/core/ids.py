"""Unique ids for request ids and quota reservations: a random per-process prefix and
a counter, 32 hex characters, unique across the processes sharing a port or a ledger.

Not `uuid4` per id: that costs a getrandom() call on the hot path, and random ids land
all over the ledger's index where a counter appends. `--workers N` forks after this
module is imported, so each forked process draws a prefix of its own.
"""

from __future__ import annotations

import itertools
import os
import uuid

_prefix = uuid.uuid4().hex[:16]
_counter = itertools.count(1)


def _new_prefix_in_child() -> None:
    global _prefix, _counter
    _prefix = uuid.uuid4().hex[:16]
    _counter = itertools.count(1)


os.register_at_fork(after_in_child=_new_prefix_in_child)


def new_id() -> str:
    """A new id, never given out before by any process."""
    return f"{_prefix}{next(_counter):016x}"

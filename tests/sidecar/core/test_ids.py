"""sidecar/core/ids.py: request and reservation ids, unique across forked workers."""

from __future__ import annotations

import os

from sidecar.core.ids import new_id
from sidecar.services.quota.ledger import new_reservation_id


def test_ids_differ_in_a_forked_child() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then exit at once
        try:
            os.write(write, new_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = new_id()
    assert len(child) == len(mine) == 32
    assert child[:16] != mine[:16]
    assert new_id() != mine


def test_reservation_ids_come_from_the_same_source() -> None:
    first, second = new_id(), new_reservation_id()
    assert first[:16] == second[:16]
    assert int(second[16:], 16) == int(first[16:], 16) + 1

"""The store's own storage layer (backing_store/storage.py): what it writes is JSON a
strict client can read, whatever a handler hands it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from backing_store.errors import StatusError
from backing_store.storage import Store


@pytest.mark.parametrize("number", [math.inf, -math.inf, math.nan])
def test_a_number_json_cannot_carry_is_a_400_and_nothing_is_written(
    tmp_path: Path, number: float
) -> None:
    """The backstop behind the body parsers: were a NaN or an infinity ever to reach a
    write (a patch computing one), it is refused, the transaction rolled back."""
    store = Store(str(tmp_path / "store.db"))
    try:
        store.write("/registry/nodes/keep", {"spec": {"a": 1}}, create=True)
        rv = store.resource_version
        with pytest.raises(StatusError) as caught:
            store.write("/registry/nodes/bad", {"spec": {"a": number}}, create=True)
        assert caught.value.code == 400
        assert "number JSON cannot carry" in caught.value.body()["message"]
        with pytest.raises(StatusError):
            store.write("/registry/nodes/keep", {"spec": {"a": number}}, create=False)
        assert store.get("/registry/nodes/bad") is None
        assert store.get("/registry/nodes/keep") == {
            "spec": {"a": 1},
            "metadata": {"resourceVersion": str(rv)},
        }
        assert store.resource_version == rv
    finally:
        store.close()

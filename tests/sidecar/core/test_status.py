"""Status bodies (sidecar/core/status.py): the encoded-body cache never mixes two errors."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core import status as errors
from sidecar.core.status import StatusError, status_body
from sidecar.wire.status import response as status_response

_DETAILS = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5))),
    # An unhashable value: encoded without the cache.
    st.builds(lambda v: {"items": v}, st.lists(st.integers(), max_size=3)),
)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([400, 403, 404, 429]),
            st.one_of(st.text(max_size=20), st.text(min_size=250, max_size=300)),
            _DETAILS,
        ),
        min_size=1,
        max_size=30,
    )
)
def test_each_error_gets_its_own_body(cases: list[tuple[int, str, dict[str, Any] | None]]) -> None:
    for code, message, details in cases:
        body = status_response(StatusError(code, message, details=details)).body
        assert isinstance(body, bytes)
        assert json.loads(body) == status_body(code, message, details=details)


def test_the_cache_stays_bounded() -> None:
    for i in range(errors.BODY_CACHE + 10):
        StatusError(429, f"too many requests for tenant t{i}").body_bytes()
    assert len(errors._bodies) <= errors.BODY_CACHE


def test_long_messages_are_not_kept() -> None:
    """A message can quote a URL's names (up to aiohttp's line limit): such bodies are
    encoded each time, so a client sending ever-new long names cannot fill memory."""
    errors._bodies.clear()
    for i in range(50):
        name = f"{i}-" + "x" * 16000
        body = StatusError(404, f'servers "{name}" not found').body_bytes()
        assert json.loads(body)["message"] == f'servers "{name}" not found'
    assert errors._bodies == {}

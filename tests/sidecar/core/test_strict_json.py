"""sidecar/core/strict_json.py: JSON as a strict client reads it (issue 28, item 4)."""

from __future__ import annotations

import pytest

from sidecar.core import strict_json

REFUSED = {
    b'{"a": 1e400}': "1e400",
    b"[-1e400]": "-1e400",
    b"[NaN]": "NaN",
    b'{"x": [Infinity]}': "Infinity",
    b"[-Infinity]": "-Infinity",
    b"[" + b"9" * 309 + b"]": "99999",
    b"[-" + b"9" * 400 + b"]": "-9999",
    b"[" + b"9" * 5000 + b"]": "99999",  # beyond Python's own limit of digits too
}


@pytest.mark.parametrize("raw", list(REFUSED))
def test_numbers_json_cannot_carry_are_refused_by_name(raw: bytes) -> None:
    for text in (raw, raw.decode()):
        with pytest.raises(strict_json.NotJsonNumber) as caught:
            strict_json.loads(text)
        message = str(caught.value)
        assert REFUSED[raw] in message
        assert "a number JSON cannot carry" in message
        assert len(message) < 200  # a 5000-digit literal is shown cut


def test_every_number_a_float_holds_is_kept() -> None:
    big = "9" * 308
    raw = f'{{"a": 1.7976931348623157e308, "b": -2, "c": 0.1, "d": {big}, "e": "{"9" * 400}"}}'
    assert strict_json.loads(raw) == {
        "a": 1.7976931348623157e308,
        "b": -2,
        "c": 0.1,
        "d": int(big),
        "e": "9" * 400,
    }


def test_other_bad_json_is_a_plain_value_error() -> None:
    with pytest.raises(ValueError, match="Expecting property name") as caught:
        strict_json.loads(b"{nope")
    assert not isinstance(caught.value, strict_json.NotJsonNumber)

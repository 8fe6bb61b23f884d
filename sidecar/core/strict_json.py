"""JSON as a strict client reads it: the one rule for which numbers a body may hold.

Python's `json` reads `NaN`, `Infinity` and `-Infinity` as numbers and turns `1e400`
into `inf`; none of them is JSON, and an object holding one makes every answer that
carries it unreadable for strict clients (Go's encoding/json, kubectl). A number must
be finite and fit a 64-bit float (so an integer of 400 digits is refused too), as the
Kubernetes API server reads it (DESIGN §9, §10). `loads` refuses anything else with
`NotJsonNumber`, whose message names the value; other bad bytes raise `ValueError`
(or `UnicodeDecodeError`) as `json.loads` does.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# An integer needs at least this many digits to pass a float's range (1.8e308), so
# the integer check runs only on bodies holding such a run of digits.
_LONG_DIGITS = re.compile(r"[0-9]{309}")
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{309}")
_SHOWN = 24


class NotJsonNumber(ValueError):
    """A number JSON cannot carry; the message names it."""

    def __init__(self, literal: str) -> None:
        shown = literal if len(literal) <= _SHOWN else literal[: _SHOWN - 1] + "…"
        super().__init__(
            f"the body holds {shown}, a number JSON cannot carry "
            "(numbers must be finite and fit a 64-bit float)"
        )


def _constant(name: str) -> Any:
    raise NotJsonNumber(name)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJsonNumber(text)
    return value


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # beyond Python's own limit of digits
        raise NotJsonNumber(text) from None
    try:
        float(value)
    except OverflowError:
        raise NotJsonNumber(text) from None
    return value


def loads(raw: bytes | str) -> Any:
    """`raw` parsed as JSON; `NotJsonNumber` for a number a strict client cannot read."""
    long_digits = (
        _LONG_DIGITS_BYTES.search(raw) if isinstance(raw, bytes) else _LONG_DIGITS.search(raw)
    )
    if long_digits:
        return json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
    return json.loads(raw, parse_constant=_constant, parse_float=_float)

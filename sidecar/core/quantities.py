"""Quota-tracked resources and Kubernetes quantity syntax: the vocabulary the quota
policy kinds (`sidecar/policy/kinds/quotas.py`) and the quota stage share.

Owns: the table of quota-tracked resources (which creates reserve quota, and where
reconcile lists them in the backing store) and quantity parsing (`500m`, `2Gi`,
`1e3`) into base units: `requests.cpu` in millicores, `requests.memory` in bytes,
objects as counts. Every amount in the ledger is an integer in these units, at most
MAX_UNITS. Parsing is exact (no float, no rounding but the final round-up to a whole
unit), and any input whatever is either an amount or a QuantityError: exponents far
out of range (`1e9999999`) are judged on the exponent alone, never computed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import (
    ROUND_CEILING,
    Context,
    Decimal,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
)
from typing import Any
from urllib.parse import quote

CPU = "requests.cpu"
MEMORY = "requests.memory"
COMPUTE_RESOURCES = (CPU, MEMORY)


@dataclass(frozen=True)
class Tracked:
    """A quota-tracked resource: its API group/version and whether it lives in a
    namespace (else it is tenant-scoped, e.g. baremetal allocations)."""

    resource: str
    group: str
    version: str
    namespaced: bool = True

    @property
    def _prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def list_path(self, tenant: str | None = None) -> str:
        """Cluster-wide list (all tenants), or all namespaces of one tenant."""
        if tenant is None:
            return f"{self._prefix}/{self.resource}"
        return f"{self._prefix}/tenants/{tenant}/{self.resource}"

    def item_path(self, tenant: str, namespace: str, name: str) -> str:
        """One object, by tenant (and namespace, when namespaced) and name, each
        percent-encoded as a path segment."""
        where = f"/tenants/{quote(tenant, safe='')}"
        if self.namespaced:
            where += f"/namespaces/{quote(namespace, safe='')}"
        return f"{self._prefix}{where}/{self.resource}/{quote(name, safe='')}"


_TABLE = [
    Tracked("servers", "compute", "v1"),
    Tracked("bays", "container", "v1"),
    Tracked("allocations", "baremetal", "v1", namespaced=False),
    Tracked("pods", "", "v1"),
    Tracked("services", "", "v1"),
    Tracked("configmaps", "", "v1"),
    Tracked("secrets", "", "v1"),
    Tracked("serviceaccounts", "", "v1"),
    Tracked("deployments", "apps", "v1"),
    Tracked("replicasets", "apps", "v1"),
    Tracked("statefulsets", "apps", "v1"),
    Tracked("daemonsets", "apps", "v1"),
    Tracked("jobs", "batch", "v1"),
    Tracked("cronjobs", "batch", "v1"),
]
TRACKED: dict[str, Tracked] = {t.resource: t for t in _TABLE}
QUOTA_RESOURCES = frozenset(TRACKED) | frozenset(COMPUTE_RESOURCES)


def tracked_for(group: str, resource: str) -> Tracked | None:
    t = TRACKED.get(resource)
    return t if t is not None and t.group == group else None


class QuantityError(ValueError):
    pass


# The largest amount of one resource the ledger holds (ledger units: millicores, bytes,
# objects): SQLite's INTEGER is 64-bit, and no charge or limit anywhere near it is real.
MAX_UNITS = 2**62
# A quantity string longer than this is refused: no real quantity comes close, and a
# bounded length keeps the decimal arithmetic exact and cheap.
MAX_QUANTITY_CHARS = 64
# Exact arithmetic for numbers of at most MAX_QUANTITY_CHARS digits times a scale of at
# most 19 digits (Ei, E) times 1000; any operation that would round or overflow raises.
_EXACT = Context(
    prec=200, Emax=1000, Emin=-1000, traps=[InvalidOperation, Overflow, Inexact, Rounded]
)
# A number's decimal exponent (`Decimal.adjusted`) beyond these bounds is decided without
# arithmetic: too large for any unit, or a positive amount below one unit (rounded up).
_TOO_LARGE_EXPONENT = 40
_TINY_EXPONENT = -40
# Kubernetes' quantity grammar: a signed decimal number, then one suffix (binary SI,
# decimal SI, or a decimal exponent `e`/`E` with a signed integer). ASCII digits only.
_QUANTITY = re.compile(
    r"([+-]?)([0-9]*(?:\.[0-9]*)?)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?",
    re.ASCII,
)

_DECIMAL_SUFFIX = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIX = {
    s: Decimal(1024) ** (i + 1) for i, s in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
}


def _shown(value: Any) -> str:
    """A quantity as an error message quotes it: never more than a few dozen characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (`500m`, `2Gi`, `1.5`, `1e3`, or a plain number) → Decimal,
    exactly. Anything else, a negative amount, or one beyond what the ledger can hold in
    any unit raises QuantityError (the caller's 400), never another exception."""
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{_shown(value)} is not a quantity")
    if isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{_shown(value)} is not a quantity")
        number = Decimal(repr(value))
    elif isinstance(value, Decimal):  # a JSON number as a streaming parser reads it
        if not value.is_finite():
            raise QuantityError(f"{_shown(value)} is not a quantity")
        number = value
    elif isinstance(value, str):
        number = _parse_string(value.strip())
    else:
        raise QuantityError(f"{_shown(value)} is not a quantity")
    if number < 0:
        raise QuantityError(f"quantity {_shown(value)} is negative")
    if number.is_zero():
        return Decimal(0)
    exponent = number.adjusted()
    if exponent > _TOO_LARGE_EXPONENT:
        raise QuantityError(f"quantity {_shown(value)} is too large")
    if exponent < _TINY_EXPONENT:
        return Decimal(1).scaleb(_TINY_EXPONENT)  # positive, below any unit
    return number


def _parse_string(text: str) -> Decimal:
    if not text:
        raise QuantityError("empty quantity")
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"quantity {_shown(text)} is longer than {MAX_QUANTITY_CHARS} characters"
        )
    match = _QUANTITY.fullmatch(text)
    if match is None or match.group(2) in ("", "."):
        raise QuantityError(f"quantity {_shown(text)} does not parse")
    sign, digits, exponent, suffix = match.groups()
    number = Decimal(sign + digits)  # exact: at most MAX_QUANTITY_CHARS digits
    if exponent is not None:
        power = int(exponent[1:])
        # Decided on the exponent alone: 10**power is never computed for a huge power.
        if number.is_zero():
            return Decimal(0)
        adjusted = number.adjusted() + power
        if adjusted > _TOO_LARGE_EXPONENT:
            raise QuantityError(f"quantity {_shown(text)} is too large")
        if adjusted < _TINY_EXPONENT:
            return Decimal(1).scaleb(_TINY_EXPONENT).copy_sign(number)
        return number.scaleb(power, _EXACT)
    if suffix in _BINARY_SUFFIX:
        return _EXACT.multiply(number, _BINARY_SUFFIX[suffix])
    return number.scaleb(_DECIMAL_SUFFIX[suffix or ""], _EXACT)


def _units(resource: str, value: Any) -> Decimal:
    q = parse_quantity(value)
    if resource == CPU:
        q = q.scaleb(3, _EXACT)
    return q


def _bounded(value: Any, units: int) -> int:
    if units > MAX_UNITS:
        raise QuantityError(f"quantity {_shown(value)} is too large")
    return units


def to_units(resource: str, value: Any) -> int:
    """A limit or request in the ledger's integer units (rounded up, as Kubernetes does):
    millicores for requests.cpu, bytes for requests.memory, the count otherwise.
    QuantityError for anything that is not a quantity or exceeds MAX_UNITS."""
    q = _units(resource, value)
    return _bounded(value, int(q.to_integral_value(rounding=ROUND_CEILING)))


def exact_units(resource: str, value: Any) -> int:
    """Like `to_units` but refuses fractions (a hard limit must be whole units)."""
    q = _units(resource, value)
    if q != q.to_integral_value():
        unit = "millicores" if resource == CPU else ("bytes" if resource == MEMORY else "objects")
        raise QuantityError(f"{_shown(value)} is not a whole number of {unit}")
    return _bounded(value, int(q))


def format_units(resource: str, amount: int) -> int | str:
    """Ledger units back to what an operator writes: `500m`, `2`, `16Gi`; counts as ints."""
    if resource == CPU:
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if resource == MEMORY:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = int(_BINARY_SUFFIX[suffix])
            if amount and amount % unit == 0:
                return f"{amount // unit}{suffix}"
        return str(amount)
    return amount

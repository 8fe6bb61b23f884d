"""Quota-tracked resources and Kubernetes quantity syntax: the vocabulary the quota
policy kinds (`sidecar/policy/quotas.py`) and the quota stage share.

Owns: the table of quota-tracked resources (which creates reserve quota, and where
reconcile lists them in the backing store) and quantity parsing (`500m`, `2Gi`,
`1e3`) into base units: `requests.cpu` in millicores, `requests.memory` in bytes,
objects as counts. Every amount in the ledger is an integer in these units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

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

    def list_path(self, tenant: str | None = None) -> str:
        """Cluster-wide list (all tenants), or all namespaces of one tenant."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if tenant is None:
            return f"{prefix}/{self.resource}"
        return f"{prefix}/tenants/{tenant}/{self.resource}"


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


_DECIMAL_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_BINARY_SUFFIX = {
    s: Decimal(1024) ** (i + 1) for i, s in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
}
_MAX = Decimal(2) ** 62


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (`500m`, `2Gi`, `1.5`, `1e3`, or a plain number) → Decimal."""
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity")
        number = Decimal(str(value))
    elif isinstance(value, str):
        number = _parse_string(value.strip())
    else:
        raise QuantityError(f"{value!r} is not a quantity")
    if number < 0:
        raise QuantityError(f"quantity {value!r} is negative")
    if number > _MAX:
        raise QuantityError(f"quantity {value!r} is too large")
    return number


def _parse_string(text: str) -> Decimal:
    if not text:
        raise QuantityError("empty quantity")
    suffix = ""
    for s in _BINARY_SUFFIX:
        if text.endswith(s):
            suffix = s
            break
    else:
        if text[-1] in _DECIMAL_SUFFIX and not text[-1].isdigit():
            suffix = text[-1]
    digits = text[: len(text) - len(suffix)]
    if not digits or not all(c in "0123456789.+-eE" for c in digits):
        raise QuantityError(f"quantity {text!r} does not parse")
    if ("e" in digits or "E" in digits) and suffix:
        raise QuantityError(f"quantity {text!r} does not parse")
    try:
        number = Decimal(digits)
    except InvalidOperation:
        raise QuantityError(f"quantity {text!r} does not parse") from None
    if not number.is_finite():
        raise QuantityError(f"quantity {text!r} does not parse")
    scale = _BINARY_SUFFIX.get(suffix) or _DECIMAL_SUFFIX[suffix]
    return number * scale


def to_units(resource: str, value: Any) -> int:
    """A limit or request in the ledger's integer units (rounded up, as Kubernetes does):
    millicores for requests.cpu, bytes for requests.memory, the count otherwise."""
    q = parse_quantity(value)
    if resource == CPU:
        q = q * 1000
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def exact_units(resource: str, value: Any) -> int:
    """Like `to_units` but refuses fractions (a hard limit must be whole units)."""
    q = parse_quantity(value)
    if resource == CPU:
        q = q * 1000
    if q != q.to_integral_value():
        unit = "millicores" if resource == CPU else ("bytes" if resource == MEMORY else "objects")
        raise QuantityError(f"{value!r} is not a whole number of {unit}")
    return int(q)


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

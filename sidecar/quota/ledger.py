"""The quota ledger interface, shared by the SQLite and Redis backends.

State per tenant, in the integer units of meters.py, each counter kept for the tenant
as a whole (namespace "") and for each namespace:
- `used`: charges of committed objects; each object's charge is recorded by
  (namespace, resource, name) so a delete returns it exactly once;
- `in_progress`: live reservations (pending creates); a reservation expires after the
  TTL, so a sidecar that dies between reserve and commit leaks nothing for long;
- limits set through the quota API (they override the policy files' limits);
- tombstones of recent deletes, so a reconcile that raced a delete does not revive it.

Every operation is one atomic step in the backend (one SQLite `BEGIN IMMEDIATE`
transaction, one Redis Lua script), and `reserve` does every check (tenant and
namespace scope) before its first write.
"""

from __future__ import annotations

import abc
import hashlib
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sidecar.quota.meters import Charge

Clock = Callable[[], float]
TENANT_SCOPE = ""
# Tombstones of deletes are kept this long (a reconcile listing older than this may
# revive a deleted object until the next reconcile).
TOMBSTONE_SECONDS = 3600.0


class LedgerError(Exception):
    """The ledger could not be reached or failed; quota-tracked creates answer 503."""


class QuotaExceeded(Exception):
    def __init__(
        self,
        scope: str,
        tenant: str,
        namespace: str,
        resource: str,
        requested: int,
        used: int,
        in_progress: int,
        limit: int,
    ) -> None:
        where = f"tenant {tenant}" if scope == "tenant" else f"namespace {tenant}/{namespace}"
        super().__init__(f"{where}: {resource} over quota")
        self.scope = scope
        self.tenant = tenant
        self.namespace = namespace
        self.resource = resource
        self.requested = requested
        self.used = used
        self.in_progress = in_progress
        self.limit = limit


@dataclass(frozen=True)
class Reservation:
    id: str
    tenant: str
    namespace: str  # "" for tenant-scoped resources
    charge: Charge
    # True when an Idempotency-Key matched an existing reservation (nothing new charged).
    reused: bool = False
    state: str = "pending"  # or "committed" (a replayed key whose create already succeeded)


@dataclass(frozen=True)
class ObjectRef:
    tenant: str
    namespace: str
    resource: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}|{self.resource}|{self.name}"


@dataclass
class Usage:
    """One tenant's counters: scope ("" = the whole tenant, else a namespace) → resource
    → amount. `limits` are the ones set through the API only."""

    used: dict[str, dict[str, int]] = field(default_factory=dict)
    in_progress: dict[str, dict[str, int]] = field(default_factory=dict)
    limits: dict[str, dict[str, int]] = field(default_factory=dict)

    def get_used(self, scope: str, resource: str) -> int:
        return self.used.get(scope, {}).get(resource, 0)

    def get_in_progress(self, scope: str, resource: str) -> int:
        return self.in_progress.get(scope, {}).get(resource, 0)


@dataclass(frozen=True)
class ReconcileResult:
    added: int
    removed: int
    changed: int
    before: dict[str, int]
    after: dict[str, int]


def reservation_id(tenant: str, user: str, idempotency_key: str | None) -> tuple[str, bool]:
    """A fresh id, or a stable one derived from (tenant, user, Idempotency-Key)."""
    if not idempotency_key:
        return uuid.uuid4().hex, False
    digest = hashlib.sha256(f"{tenant}\0{user}\0{idempotency_key}".encode()).hexdigest()
    return "idem-" + digest[:32], True


def split_field(fieldname: str) -> tuple[str, str]:
    """`"dev|servers"` → ("dev", "servers"); `"|servers"` → ("", "servers")."""
    scope, _, resource = fieldname.partition("|")
    return scope, resource


class Ledger(abc.ABC):
    """Reservations, committed charges and API-set limits; see the module docstring."""

    def __init__(self, ttl_seconds: float, clock: Clock | None = None) -> None:
        self.ttl = ttl_seconds
        self.clock: Clock = clock or time.time

    @abc.abstractmethod
    async def reserve(
        self,
        tenant: str,
        namespace: str,
        charge: Mapping[str, int],
        tenant_limits: Mapping[str, int],
        namespace_limits: Mapping[str, int],
        reservation_id: str,
        idempotent: bool = False,
    ) -> Reservation:
        """Check every resource of `charge` against the tenant limits and (when
        `namespace`) the namespace limits — API-set limits override the given ones —
        then record a reservation. Raises QuotaExceeded (nothing written)."""

    @abc.abstractmethod
    async def commit(self, reservation: Reservation, name: str, resource: str) -> bool:
        """Record object `name` with the reservation's charge and move it from
        in_progress to used. Idempotent per object: returns False when the object was
        already recorded. Works (charges used) even if the reservation expired."""

    @abc.abstractmethod
    async def release(self, reservation: Reservation) -> None:
        """Drop a pending reservation; a committed or expired one is left alone."""

    @abc.abstractmethod
    async def delete(self, obj: ObjectRef) -> Charge | None:
        """Return an object's recorded charge to the quota, once (None afterwards)."""

    @abc.abstractmethod
    async def delete_scope(self, tenant: str, namespace: str | None) -> int:
        """A namespace (or a whole tenant, namespace=None) was deleted: return the
        charges of all its objects. A tenant's API-set limits go with it."""

    @abc.abstractmethod
    async def usage(self, tenant: str) -> Usage:
        """The tenant's counters after dropping expired reservations."""

    @abc.abstractmethod
    async def set_limit(
        self, tenant: str, namespace: str, resource: str, hard: int | None
    ) -> None:
        """Set (or with None, remove) an API limit for the tenant or a namespace."""

    @abc.abstractmethod
    async def tenants(self) -> list[str]:
        """Tenants that have ever had usage or API-set limits here."""

    @abc.abstractmethod
    async def reconcile_set(
        self,
        tenant: str,
        resources: list[str],
        objects: Mapping[ObjectRef, Charge],
        started_at: float,
    ) -> ReconcileResult:
        """Replace the recorded objects of `resources` in `tenant` with `objects` (the
        backing store's listing taken from `started_at` on), keeping objects committed
        since then and not reviving objects deleted since then; recompute `used`.
        Reservations are untouched."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise LedgerError when the backend is unreachable."""

    @abc.abstractmethod
    async def close(self) -> None: ...


def open_ledger(url: str, ttl_seconds: float, clock: Clock | None = None,
                redis_prefix: str = "sidecar:quota:") -> Ledger:
    """`sqlite:///path` (relative: `sqlite:///./x.db`) or `redis://host:port/db`."""
    if url.startswith("sqlite://"):
        from sidecar.quota.sqlite import SqliteLedger

        path = url[len("sqlite://") :]
        if path.startswith(("/./", "/../", "//")):
            path = path[1:]
        return SqliteLedger(path or ":memory:", ttl_seconds, clock)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from sidecar.quota.redis import RedisLedger

        return RedisLedger(url, ttl_seconds, clock, prefix=redis_prefix)
    raise ValueError(f"unknown ledger URL {url!r} (expected sqlite:///path or redis://…)")

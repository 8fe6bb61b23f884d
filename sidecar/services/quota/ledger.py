"""The quota ledger interface, shared by the SQLite and Redis backends.

State per tenant, in the integer units of meters.py, each counter kept for the tenant
as a whole (namespace "") and for each namespace:
- `used`: charges of committed objects; each object's charge is recorded by
  (namespace, resource, name) so a delete returns it exactly once;
- `in_progress`: live reservations (pending creates); a reservation expires after the
  TTL, so a sidecar that dies between reserve and commit leaks nothing for long;
- limits set through the quota API (they override the policy files' limits);
- tombstones of recent deletes, so a reconcile that raced a delete does not revive it;
- claims: a reservation may hold a claim (an `Idempotency-Key` of a create, or the
  object an update changes), at most one live reservation per claim and tenant; a
  committed create that holds an `Idempotency-Key` keeps the create's answer (`Answer`)
  until it expires, so a retry gets that answer replayed (`ClaimReplay`);
- unsettled reservations: a pending create whose outcome the sidecar did not see is
  marked with the object it would have made and the time from which a 404 on reading
  it back may release it (`mark_unsettled`), so any sidecar process can settle it
  against the store (`unsettled`; DESIGN §7).

Every operation is idempotent by reservation id, so a call whose answer was lost (a
ledger that stalled past the client's timeout) can be made again, and a release may
arrive before the reserve it undoes: the released id is remembered until it would have
expired, and a reserve with it does nothing. A delete is idempotent by the object's
identity: it returns the charge of the object recorded before the delete happened
(`at`), once, so one made again after a lost answer never takes the charge of an
object of the same name made since.

Every operation is one atomic step in the backend (in SQLite a savepoint of a
`BEGIN IMMEDIATE` transaction that may carry other operations queued with it, see
sqlite.py; one Redis Lua script), is answered only once that step is durable as
docs/quotas.md ("Durability") describes, and `reserve` does every check (tenant and
namespace scope) before its first write.
"""

from __future__ import annotations

import abc
import base64
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from sidecar.core.ids import new_id
from sidecar.services.quota.meters import Charge

Clock = Callable[[], float]
TENANT_SCOPE = ""
# Tombstones of deletes are kept this long (a reconcile listing older than this may
# revive a deleted object until the next reconcile).
TOMBSTONE_SECONDS = 3600.0


class LedgerError(Exception):
    """The ledger could not be reached or failed; quota-tracked creates answer 503.

    `str(exc)` is `reason`: short and safe to show in a Status body or `/readyz` (never a
    file path, URL or exception text). `detail` carries those, for the log only.
    `ambiguous`: the operation may have taken effect all the same, or may still (its
    answer was lost: a timeout, a connection cut after the call was sent); otherwise it
    certainly did not (a transaction rolled back, a refused command)."""

    def __init__(self, reason: str, detail: str = "", ambiguous: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or reason
        self.ambiguous = ambiguous


class ClaimConflict(Exception):
    """A live reservation already holds the claim: `in_flight` (it is pending → 409),
    else the claim was used by a different request (another body or path → 422)."""

    def __init__(self, in_flight: bool) -> None:
        super().__init__("in flight" if in_flight else "different request")
        self.in_flight = in_flight


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


class ClaimReplay(Exception):
    """The `Idempotency-Key` was used by the same create, which completed: its answer is
    replayed (DESIGN §7), whatever the quota says now."""

    def __init__(self, answer: Answer) -> None:
        super().__init__("replay")
        self.answer = answer


# A create's answer larger than this is not kept for replay (a retry then reaches the
# store, which answers AlreadyExists); real create answers are far smaller.
MAX_ANSWER_BYTES = 256 * 1024


@dataclass(frozen=True)
class Answer:
    """A create's answer as the client got it, kept for an `Idempotency-Key` replay."""

    status: int
    content_type: str
    body: bytes

    def encode(self) -> str:
        """A compact JSON string (the body base64), or "" when too large to keep."""
        if len(self.body) > MAX_ANSWER_BYTES:
            return ""
        return json.dumps(
            [self.status, self.content_type, base64.b64encode(self.body).decode("ascii")],
            separators=(",", ":"),
        )

    @staticmethod
    def decode(text: str) -> Answer | None:
        try:
            status, ctype, body = json.loads(text)
            return Answer(int(status), str(ctype), base64.b64decode(body))
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class Reservation:
    id: str
    tenant: str
    namespace: str  # "" for tenant-scoped resources
    charge: Charge
    created: float = 0.0  # the ledger clock when reserved


@dataclass(frozen=True)
class Claim:
    """What a reservation holds exclusively: `key` names it, `fingerprint` tells the
    request that took it from another one using the same key."""

    key: str
    fingerprint: str = ""


@dataclass(frozen=True)
class ObjectRef:
    tenant: str
    namespace: str
    resource: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}|{self.resource}|{self.name}"


class Unsettled(NamedTuple):
    """A pending create marked by `mark_unsettled`: the object it would have made, and
    the ledger time from which a 404 on reading that object back may release it (the
    upstream may still be making it until then)."""

    reservation: Reservation
    obj: ObjectRef
    release_after: float


def encode_mark(obj: ObjectRef, release_after: float | None) -> str:
    """What `mark_unsettled` stores (both backends): namespace, resource, name and the
    release time (None: when the reservation expires)."""
    mark: list[object] = [obj.namespace, obj.resource, obj.name]
    if release_after is not None:
        mark.append(release_after)
    return json.dumps(mark)


def decode_mark(r: Reservation, mark: str, expires: float) -> Unsettled:
    """An `encode_mark` string back (one of an earlier version, without a release time:
    released no earlier than when the reservation expires)."""
    namespace, resource, name, *rest = json.loads(mark)
    release_after = float(rest[0]) if rest else expires
    return Unsettled(r, ObjectRef(r.tenant, namespace, resource, name), release_after)


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


def new_reservation_id() -> str:
    return new_id()  # sidecar/core/ids.py: per-process prefix + counter


def idempotency_claim(caller_tenant: str, key: str, method: str, path: str, body: bytes) -> Claim:
    """An `Idempotency-Key`, scoped to the caller's tenant, with the fingerprint of the
    request (method, path with query, body bytes) that used it."""
    name = hashlib.sha256(f"{caller_tenant}\0{key}".encode()).hexdigest()[:40]
    h = hashlib.sha256(f"{method}\0{path}\0".encode())
    h.update(body)
    return Claim("idem:" + name, h.hexdigest())


def object_claim(obj: ObjectRef) -> Claim:
    """The claim an update holds on the object it changes (one update in flight each)."""
    return Claim("obj:" + obj.key)


def charge_delta(new: Mapping[str, int], old: Mapping[str, int]) -> dict[str, int]:
    """new - old per resource (zeros left out)."""
    out = {r: int(new.get(r, 0)) - int(old.get(r, 0)) for r in set(new) | set(old)}
    return {r: d for r, d in out.items() if d}


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
        claim: Claim | None = None,
    ) -> Reservation:
        """Check every resource of `charge` against the tenant limits and (when
        `namespace`) the namespace limits — API-set limits override the given ones —
        then record a reservation. Raises QuotaExceeded (nothing written).

        With a `claim`: a live reservation holding the same claim key with another
        fingerprint → ClaimConflict(in_flight=False); a pending one with the same
        fingerprint → ClaimConflict(in_flight=True); a committed one with the same
        fingerprint that kept its answer → ClaimReplay (nothing checked or written);
        one without an answer is replaced, and this request is checked and charged like
        any other (a claim never skips the check).

        A reservation id reserves once: a second call with the same id (a retry), or one
        made after the id was released, does nothing."""

    @abc.abstractmethod
    async def reserve_change(
        self,
        reservation: Reservation,
        obj: ObjectRef,
        new_charge: Mapping[str, int],
        base_charge: Mapping[str, int],
        tenant_limits: Mapping[str, int],
        namespace_limits: Mapping[str, int],
    ) -> Reservation:
        """An update of `obj` (whose claim `reservation` holds) will make its charge
        `new_charge`: the increase over its recorded charge (`base_charge` when the
        object is not recorded) is checked like a create and becomes the reservation's
        charge. Raises QuotaExceeded (nothing written), LedgerError when the
        reservation is gone (expired)."""

    @abc.abstractmethod
    async def commit_change(
        self, reservation: Reservation, obj: ObjectRef, new_charge: Mapping[str, int]
    ) -> None:
        """The update succeeded: drop the reservation (and its claim) and record
        `new_charge` as the object's charge, `used` moving by the difference from its
        recorded charge. An object deleted since the reservation stays deleted."""

    @abc.abstractmethod
    async def commit(
        self,
        reservation: Reservation,
        name: str,
        resource: str,
        charge: Mapping[str, int] | None = None,
        answer: Answer | None = None,
    ) -> bool:
        """Drop the reservation from in_progress and record object `name` with `charge`
        (the object as the store made it; the reservation's charge when None) in used.
        A reservation holding a claim keeps `answer` for a replay. Idempotent per
        object: returns False when the object was already recorded since the
        reservation was made; a record from before then is of an earlier object of that
        name whose delete the ledger has not recorded (yet), and is replaced. Works
        (charges used) even if the reservation expired or was released."""

    @abc.abstractmethod
    async def release(self, reservation: Reservation) -> None:
        """Drop a pending reservation (and its claim); a committed or expired one is
        left alone. An id never reserved is remembered as released until the TTL has
        passed, so a reserve with it that arrives late does nothing."""

    @abc.abstractmethod
    async def mark_unsettled(
        self, reservation: Reservation, obj: ObjectRef, release_after: float | None = None
    ) -> None:
        """A pending create's outcome is unknown: remember the object it would have made,
        and the ledger time from which a 404 on reading it back may release it (None:
        when the reservation expires), so that any process can settle it (`unsettled`).
        It still counts as in progress. A reservation no longer pending is left alone."""

    @abc.abstractmethod
    async def unsettled(self, tenant: str) -> list[Unsettled]:
        """The tenant's pending reservations marked by `mark_unsettled` (not expired)."""

    @abc.abstractmethod
    async def delete(self, obj: ObjectRef, at: float | None = None) -> Charge | None:
        """The object was deleted at ledger time `at` (None: now): return its recorded
        charge to the quota, once (None afterwards). A record made after `at` is of
        another object of the same name, made since, and is left alone."""

    @abc.abstractmethod
    async def delete_scope(
        self, tenant: str, namespace: str | None, at: float | None = None
    ) -> int:
        """A namespace (or a whole tenant, namespace=None) was deleted at ledger time
        `at` (None: now): return the charges of all its objects recorded before then
        (`used` is recounted from the objects left). Its API-set limits go with it."""

    @abc.abstractmethod
    async def usage(self, tenant: str) -> Usage:
        """The tenant's counters after dropping expired reservations."""

    @abc.abstractmethod
    async def set_limit(self, tenant: str, namespace: str, resource: str, hard: int | None) -> None:
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
        """A write (a heartbeat): raise LedgerError when the backend cannot be reached
        or cannot be written (a full disk, a read-only file, a Redis refusing writes)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

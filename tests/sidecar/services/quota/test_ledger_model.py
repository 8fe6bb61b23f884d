"""Model-based test of the ledger, for both backends: random sequences of reserve,
commit, release, expire, delete, limit update and reconcile, checked step by step
against a plain-Python model, with the invariants: nothing is ever negative;
used + in_progress ≤ hard unless an admin lowered a limit (or a late commit or a
reconcile counted objects the ledger had not admitted); an idempotency claim is 409 while
pending, 422 for another fingerprint, and never skips the check; retries never
double-count."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis as syncredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

from sidecar.services.quota.ledger import (
    Claim,
    ClaimConflict,
    Ledger,
    ObjectRef,
    QuotaExceeded,
    Reservation,
    new_reservation_id,
)
from tests.rigs.clock import FakeClock
from tests.rigs.ledgers import make_ledger

TTL = 30.0
TENANT = "acme"
NAMESPACES = ["a", "b"]
REDIS_URL = os.environ.get("SIDECAR_TEST_REDIS", "redis://127.0.0.1:6379/0")


@dataclass
class ModelRes:
    ns: str
    charge: dict[str, int]
    state: str
    expires: float
    claim: str = ""
    fp: str = ""


@dataclass
class Model:
    tenant_limits: dict[str, int]
    ns_limits: dict[str, dict[str, int]]
    api: dict[str, dict[str, int]] = field(default_factory=dict)
    reservations: dict[str, ModelRes] = field(default_factory=dict)
    objects: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    # When each object was recorded: a commit under a reservation made later is of
    # another object of that name (the earlier one's delete not recorded) and replaces it.
    recorded: dict[tuple[str, str], float] = field(default_factory=dict)

    def purge(self, now: float) -> None:
        for rid in [r for r, v in self.reservations.items() if v.expires <= now]:
            del self.reservations[rid]

    def limits(self, scope: str) -> dict[str, int]:
        base = self.tenant_limits if scope == "" else self.ns_limits.get(scope, {})
        return {**base, **self.api.get(scope, {})}

    def used(self, scope: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for (ns, _), charge in self.objects.items():
            if scope in ("", ns):
                for r, n in charge.items():
                    out[r] = out.get(r, 0) + n
        return out

    def in_progress(self, scope: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.reservations.values():
            if v.state == "pending" and scope in ("", v.ns):
                for r, n in v.charge.items():
                    out[r] = out.get(r, 0) + n
        return out


class LedgerMachine(RuleBasedStateMachine):
    backend = "sqlite"
    reservations = Bundle("reservations")
    objects = Bundle("objects")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.dir = Path(tempfile.mkdtemp(prefix="quota-model-"))
        self.prefix = f"test-model-{uuid.uuid4().hex[:10]}:"
        self.ledger: Ledger = make_ledger(
            self.backend, self.dir, self.clock, TTL, redis_url=REDIS_URL, prefix=self.prefix
        )
        self.model = Model({"servers": 4, "requests.cpu": 1000}, {"a": {"servers": 2}})
        self.may_exceed = False
        self.names = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.ledger.close())
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.backend == "redis":
            client = syncredis.Redis.from_url(REDIS_URL)
            keys = list(client.scan_iter(match=f"{self.prefix}*"))
            if keys:
                client.delete(*keys)
            client.close()

    @rule(
        target=reservations,
        ns=st.sampled_from(NAMESPACES),
        cpu=st.sampled_from([0, 100, 400]),
        key=st.sampled_from([None, "k1", "k2"]),
    )
    def reserve(self, ns: str, cpu: int, key: str | None) -> Any:
        m = self.model
        now = self.clock()
        m.purge(now)
        charge = {"servers": 1, **({"requests.cpu": cpu} if cpu else {})}
        rid = new_reservation_id()
        claim = Claim(f"idem:{key}", f"{ns}/{cpu}") if key else None
        holder = None
        if claim is not None:
            holder = next((i for i, v in m.reservations.items() if v.claim == claim.key), None)
        conflict = None  # None, or the expected ClaimConflict.in_flight
        if holder is not None and claim is not None:
            v = m.reservations[holder]
            if v.fp != claim.fingerprint:
                conflict = False
            elif v.state == "pending":
                conflict = True
        expected_refusal = None
        if conflict is None:
            for scope in ("", ns):
                limits, used, inp = m.limits(scope), m.used(scope), m.in_progress(scope)
                for res, n in charge.items():
                    hard = limits.get(res)
                    if hard is not None and used.get(res, 0) + inp.get(res, 0) + n > hard:
                        expected_refusal = (res, scope)
                        break
                if expected_refusal:
                    break
        try:
            r = self.run(
                self.ledger.reserve(
                    TENANT, ns, charge, m.tenant_limits, m.ns_limits.get(ns, {}), rid, claim
                )
            )
        except ClaimConflict as exc:
            assert conflict is not None
            assert exc.in_flight == conflict  # noqa: PT017 (the model decides whether it raises)
            return None
        except QuotaExceeded as exc:
            assert conflict is None, "a claim conflict was expected"
            assert expected_refusal is not None, "refused although the model has room"
            assert exc.resource == expected_refusal[0]  # noqa: PT017 (the model decides whether it raises)
            return None
        assert conflict is None, "a claim conflict was expected"
        assert expected_refusal is None, f"admitted over {expected_refusal}"
        if holder is not None:
            del m.reservations[holder]  # a committed claim is taken over
        m.reservations[rid] = ModelRes(
            ns,
            charge,
            "pending",
            now + TTL,
            claim.key if claim else "",
            claim.fingerprint if claim else "",
        )
        return r

    @rule(target=objects, r=consumes(reservations), same_name=st.booleans())
    def commit(self, r: Reservation | None, same_name: bool) -> Any:
        if r is None:
            return None
        m = self.model
        now = self.clock()
        m.purge(now)
        live = m.reservations.get(r.id)
        if live is None or live.state != "pending":
            self.may_exceed = True  # a late commit counts an object nobody admitted now
        name = "n0" if same_name else f"n{self.names}"
        self.names += 1
        created = self.run(self.ledger.commit(r, name, "servers"))
        if live is not None and live.state == "pending":
            live.state = "committed"
        key = (r.namespace, name)
        assert created == (key not in m.objects or m.recorded[key] < r.created)
        if created:
            m.objects[key] = dict(r.charge)
            m.recorded[key] = now
        return ObjectRef(TENANT, r.namespace, "servers", name)

    @rule(r=consumes(reservations))
    def release(self, r: Reservation | None) -> None:
        if r is None:
            return
        self.run(self.ledger.release(r))
        live = self.model.reservations.get(r.id)
        if live is not None and live.state == "pending":
            del self.model.reservations[r.id]

    @rule(r=reservations)
    def retry_commit(self, r: Reservation | None) -> None:
        """A replayed commit of a reservation already handed out never double-counts:
        of an object recorded since the reservation was made it changes nothing; one
        recorded before is replaced (its count stays)."""
        if r is None or not self.model.objects:
            return
        m = self.model
        before = self.run(self.ledger.usage(TENANT)).used
        for key in list(m.objects):
            if key[0] == r.namespace:
                replaced = m.recorded[key] < r.created
                assert self.run(self.ledger.commit(r, key[1], "servers")) is replaced
                live = m.reservations.get(r.id)
                if live is not None and live.state == "pending" and live.expires > self.clock():
                    live.state = "committed"
                if replaced:
                    m.objects[key] = dict(r.charge)
                    m.recorded[key] = self.clock()
                break
        after = self.run(self.ledger.usage(TENANT)).used
        assert {s: c.get("servers") for s, c in after.items()} == {
            s: c.get("servers") for s, c in before.items()
        }

    @rule(seconds=st.sampled_from([1.0, TTL / 2, TTL]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.model.purge(self.clock())

    @rule(obj=objects)
    def delete(self, obj: ObjectRef | None) -> None:
        if obj is None:
            return
        got = self.run(self.ledger.delete(obj))
        expected = self.model.objects.pop((obj.namespace, obj.name), None)
        self.model.recorded.pop((obj.namespace, obj.name), None)
        assert got == expected

    @rule(scope=st.sampled_from(["", "a", "b"]), value=st.one_of(st.none(), st.integers(0, 6)))
    def update(self, scope: str, value: int | None) -> None:
        m = self.model
        old = m.limits(scope).get("servers")
        self.run(self.ledger.set_limit(TENANT, scope, "servers", value))
        if value is None:
            m.api.get(scope, {}).pop("servers", None)
        else:
            m.api.setdefault(scope, {})["servers"] = value
        new = m.limits(scope).get("servers")
        if new is not None and (old is None or new < old):
            self.may_exceed = True

    @rule(drop=st.booleans(), extra=st.booleans())
    def reconcile(self, drop: bool, extra: bool) -> None:
        m = self.model
        self.clock.advance(1)
        m.purge(self.clock())
        truth = dict(m.objects)
        if drop and truth:
            truth.pop(sorted(truth)[0])
        if extra:
            truth[("b", f"ext{self.names}")] = {"servers": 1}
            self.names += 1
            self.may_exceed = True
        listing = {ObjectRef(TENANT, ns, "servers", n): c for (ns, n), c in truth.items()}
        self.run(self.ledger.reconcile_set(TENANT, ["servers"], listing, self.clock()))
        m.objects = truth
        m.recorded = {k: m.recorded.get(k, self.clock()) for k in truth}

    @invariant()
    def matches_model(self) -> None:
        m = self.model
        m.purge(self.clock())
        usage = self.run(self.ledger.usage(TENANT))
        for scope in ("", "a", "b"):
            used = {r: n for r, n in usage.used.get(scope, {}).items() if n}
            inp = {r: n for r, n in usage.in_progress.get(scope, {}).items() if n}
            assert used == m.used(scope), (scope, used, m.used(scope))
            assert inp == m.in_progress(scope), (scope, inp, m.in_progress(scope))
            for counters in (usage.used, usage.in_progress):
                assert all(n >= 0 for n in counters.get(scope, {}).values())
            if not self.may_exceed:
                for res, hard in m.limits(scope).items():
                    assert used.get(res, 0) + inp.get(res, 0) <= hard


SETTINGS = settings(
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class SqliteMachine(LedgerMachine):
    backend = "sqlite"


class RedisMachine(LedgerMachine):
    backend = "redis"


def test_model_sqlite() -> None:
    SqliteMachine.TestCase.settings = SETTINGS
    SqliteMachine.TestCase().runTest()


def test_model_redis(redis_url: str) -> None:
    RedisMachine.TestCase.settings = SETTINGS
    RedisMachine.TestCase().runTest()


def test_model_sees_a_broken_ledger() -> None:
    """The model test can fail: a ledger that forgets to release is caught."""

    class Leaky(SqliteMachine):
        def __init__(self) -> None:
            super().__init__()

            async def no_release(_: Reservation) -> None:
                return None

            self.ledger.release = no_release  # type: ignore[method-assign,assignment]

    Leaky.TestCase.settings = settings(SETTINGS, max_examples=100, database=None, derandomize=True)
    with pytest.raises(AssertionError):
        Leaky.TestCase().runTest()

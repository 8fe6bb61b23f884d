"""The Redis quota ledger, shared by replicas on many hosts: one server (`redis://`),
a Redis Cluster (`redis+cluster://`) or a Sentinel-watched master (`redis+sentinel://`),
each also over TLS; sidecar/services/redis_client.py turns the URL into the client.

One Lua script per operation, so each is atomic; `reserve` does every check before its
first write (a script error does not roll back earlier writes). A script touches only
the keys it is passed (the cluster rule), and those are one tenant's, all carrying the
hash tag `{tenant}`, so every script runs on one cluster slot:

  {prefix}{T}:used     hash  "scope|resource" → amount   (scope "" = whole tenant)
  {prefix}{T}:inprog   hash  "scope|resource" → amount   (pending reservations)
  {prefix}{T}:res      hash  reservation id → {ns, charge, state, claim, fp, answer,
                             settle}: pending ones, committed ones holding a claim, and
                             released ids (each until it expires)
  {prefix}{T}:resexp   zset  reservation id by expiry time
  {prefix}{T}:objs     hash  "ns|resource|name" → {ns, charge, at}
  {prefix}{T}:limits   hash  "scope|resource" → API-set hard limit
  {prefix}{T}:tomb     zset  "ns|resource|name" by delete time
  {prefix}{T}:claims   hash  claim → reservation id (Idempotency-Key, object updated)

No key spans tenants: `tenants()` (for `quota list` and a reconcile of all tenants)
SCANs every master for the tenants' keys, so nothing on one node indexes them all.

The client retries a call across a redirect or a reconnection, so a script may run
twice for one call: each is idempotent (a reservation id reserves once; commit,
release and delete act once per object or reservation). A release of an id not (yet)
reserved remembers it as released until it would have expired, so a reserve that
timed out and reaches Redis after the sidecar released it does nothing (DESIGN §7).
A committed create that holds an `Idempotency-Key` keeps its answer (`answer`) for a
replay; a pending create whose outcome is unknown carries the object it would make and
when a 404 may release it (`settle`), for any process to settle it. A delete is made at
the time it happened (`at`): an object recorded after it stays; a commit replaces a
record older than its reservation (an earlier object of that name). The readiness
check writes a heartbeat key under the prefix.

While a master fails over, calls for its tenants fail (LedgerError: quota-tracked
creates answer 503) until a replica has taken over. Replication is asynchronous: a
write acknowledged just before the master died may be lost; reconcile restores `used`
from the store.

Errors: LedgerError's public reason is "ledger unreachable" (or "ledger error"); the
Redis message, redacted of any password, is for the log only.

Times come from the ledger's clock (an argument), so expiry is testable; replicas on
several hosts need synchronised clocks (NTP), as the TTL is minutes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from redis.exceptions import ClusterError, ResponseError

from sidecar.config.settings import QUOTA_REDIS_PREFIX
from sidecar.services.quota.ledger import (
    TENANT_SCOPE,
    TOMBSTONE_SECONDS,
    Answer,
    Claim,
    ClaimConflict,
    ClaimReplay,
    Clock,
    Ledger,
    LedgerError,
    ObjectRef,
    QuotaExceeded,
    ReconcileResult,
    Reservation,
    Unsettled,
    Usage,
    decode_mark,
    encode_mark,
    split_field,
)
from sidecar.services.quota.meters import Charge
from sidecar.services.redis_client import ERRORS, RedisHandle, error_text, open_redis, tenant_key

# KEYS: used, inprog, res, resexp, objs, limits, tomb, claims
_COMMON = """
local function s(n) return string.format('%.0f', n) end
local function bump(key, field, delta)
  local v = redis.call('HINCRBY', key, field, s(delta))
  if v < 0 then redis.call('HSET', key, field, 0) end
end
local function apply(key, ns, charge, sign)
  for res, n in pairs(charge) do
    bump(key, '|' .. res, sign * n)
    if ns ~= '' then bump(key, ns .. '|' .. res, sign * n) end
  end
end
local function unclaim(r, id)
  if type(r.claim) == 'string' and r.claim ~= '' and redis.call('HGET', KEYS[8], r.claim) == id then
    redis.call('HDEL', KEYS[8], r.claim)
  end
end
local function drop(id)
  local raw = redis.call('HGET', KEYS[3], id)
  if raw then
    local r = cjson.decode(raw)
    if r.state == 'pending' then apply(KEYS[2], r.ns, r.charge, -1) end
    unclaim(r, id)
    redis.call('HDEL', KEYS[3], id)
  end
  redis.call('ZREM', KEYS[4], id)
end
local function purge(now)
  local ids = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  for _, id in ipairs(ids) do drop(id) end
end
local function num(key, field)
  return tonumber(redis.call('HGET', key, field) or '0') or 0
end
local function check(ns, charge, tlimits, nlimits)
  local scopes = {{'tenant', '', tlimits}}
  if ns ~= '' then table.insert(scopes, {'namespace', ns, nlimits}) end
  for _, sc in ipairs(scopes) do
    for res, n in pairs(charge) do
      local field = sc[2] .. '|' .. res
      local hard = tonumber(redis.call('HGET', KEYS[6], field) or '') or sc[3][res]
      if hard then
        local u, p = num(KEYS[1], field), num(KEYS[2], field)
        if u + p + n > hard then return cjson.encode({sc[1], res, n, u, p, hard}) end
      end
    end
  end
  return nil
end
"""

_RESERVE = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local expires = tonumber(ARGV[2])
local id, ns = ARGV[3], ARGV[4]
local claim, fp = ARGV[8], ARGV[9]
purge(now)
-- the same call again (the client retried it): it reserved already
if redis.call('HEXISTS', KEYS[3], id) == 1 then return {'ok', ''} end
local previous = nil
if claim ~= '' then
  local held = redis.call('HGET', KEYS[8], claim)
  local raw = held and redis.call('HGET', KEYS[3], held)
  if raw then
    local r = cjson.decode(raw)
    if r.fp ~= fp then return {'conflict', 'mismatch'} end
    if r.state == 'pending' then return {'conflict', 'inflight'} end
    if type(r.answer) == 'string' and r.answer ~= '' then return {'replay', r.answer} end
    previous = held
  end
end
local charge = cjson.decode(ARGV[5])
local refusal = check(ns, charge, cjson.decode(ARGV[6]), cjson.decode(ARGV[7]))
if refusal then return {'refused', refusal} end
if previous then drop(previous) end
redis.call('HSET', KEYS[3], id,
  cjson.encode({ns = ns, charge = charge, state = 'pending', claim = claim, fp = fp}))
redis.call('ZADD', KEYS[4], expires, id)
if claim ~= '' then redis.call('HSET', KEYS[8], claim, id) end
apply(KEYS[2], ns, charge, 1)
return {'ok', ''}
"""
)

_RESERVE_CHANGE = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local id, objkey = ARGV[2], ARGV[3]
purge(now)
local raw = redis.call('HGET', KEYS[3], id)
if not raw then return {'gone', ''} end
local r = cjson.decode(raw)
if r.state ~= 'pending' then return {'gone', ''} end
apply(KEYS[2], r.ns, r.charge, -1)
r.charge = {}
local base = cjson.decode(ARGV[5])
local o = redis.call('HGET', KEYS[5], objkey)
if o then base = cjson.decode(o).charge end
local increase = {}
for res, n in pairs(cjson.decode(ARGV[4])) do
  local d = n - (tonumber(base[res]) or 0)
  if d > 0 then increase[res] = d end
end
local refusal = check(r.ns, increase, cjson.decode(ARGV[6]), cjson.decode(ARGV[7]))
if refusal then
  redis.call('HSET', KEYS[3], id, cjson.encode(r))
  return {'refused', refusal}
end
r.charge = increase
redis.call('HSET', KEYS[3], id, cjson.encode(r))
apply(KEYS[2], r.ns, increase, 1)
return {'ok', cjson.encode(increase)}
"""
)

_COMMIT_CHANGE = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local id, objkey, ns = ARGV[2], ARGV[3], ARGV[4]
purge(now)
drop(id)
local t = redis.call('ZSCORE', KEYS[7], objkey)
if t and tonumber(t) >= tonumber(ARGV[7]) then return 0 end
local new = cjson.decode(ARGV[5])
local raw = redis.call('HGET', KEYS[5], objkey)
local o
if raw then
  o = cjson.decode(raw)
  apply(KEYS[1], ns, o.charge, -1)
else
  o = {ns = ns, res = ARGV[6], at = now}
end
o.charge = new
redis.call('HSET', KEYS[5], objkey, cjson.encode(o))
apply(KEYS[1], ns, new, 1)
return 1
"""
)

_COMMIT = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local id, objkey, ns = ARGV[2], ARGV[3], ARGV[4]
local charge = cjson.decode(ARGV[5])
purge(now)
local raw = redis.call('HGET', KEYS[3], id)
if raw then
  local r = cjson.decode(raw)
  if r.state == 'pending' then
    apply(KEYS[2], r.ns, r.charge, -1)
    if type(r.claim) == 'string' and r.claim ~= '' then
      -- kept (committed) until it expires: the claim and the answer are remembered
      r.state = 'committed'
      r.answer = ARGV[7]
      r.settle = nil
      redis.call('HSET', KEYS[3], id, cjson.encode(r))
    else
      redis.call('HDEL', KEYS[3], id)
      redis.call('ZREM', KEYS[4], id)
    end
  end
end
local old = redis.call('HGET', KEYS[5], objkey)
if old then
  local o = cjson.decode(old)
  -- a record from before this reservation is of an earlier object of that name, whose
  -- delete the ledger has not recorded (yet): this one replaces it
  if (tonumber(o.at) or 0) >= tonumber(ARGV[8]) then return 0 end
  apply(KEYS[1], o.ns, o.charge, -1)
end
redis.call('HSET', KEYS[5], objkey,
  cjson.encode({ns = ns, res = ARGV[6], charge = charge, at = now}))
redis.call('ZREM', KEYS[7], objkey)
apply(KEYS[1], ns, charge, 1)
return 1
"""
)

_RELEASE = (
    _COMMON
    + """
local raw = redis.call('HGET', KEYS[3], ARGV[1])
if not raw then
  -- remembered as released until it would have expired: a late reserve does nothing
  redis.call('HSET', KEYS[3], ARGV[1], cjson.encode({state = 'released', ns = ''}))
  redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
  return 0
end
local r = cjson.decode(raw)
if r.state ~= 'pending' then return 0 end
drop(ARGV[1])
return 1
"""
)

_DELETE = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local objkey = ARGV[2]
local at = tonumber(ARGV[4])
local raw = redis.call('HGET', KEYS[5], objkey)
local o = raw and cjson.decode(raw)
-- made after this delete: another object of the same name
if o and (tonumber(o.at) or 0) > at then return false end
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now - tonumber(ARGV[3]))
if (tonumber(redis.call('ZSCORE', KEYS[7], objkey)) or at) <= at then
  redis.call('ZADD', KEYS[7], at, objkey)
end
if not o then return false end
apply(KEYS[1], o.ns, o.charge, -1)
redis.call('HDEL', KEYS[5], objkey)
return cjson.encode(o.charge)
"""
)

_DELETE_SCOPE = (
    _COMMON
    + """
local all = ARGV[2] == '1'
local ns = ARGV[3]
local at = tonumber(ARGV[4])
local n = 0
local objs = redis.call('HGETALL', KEYS[5])
for i = 1, #objs, 2 do
  local o = cjson.decode(objs[i + 1])
  -- one recorded after the delete (made since, in a scope made again) stays
  if (all or o.ns == ns) and (tonumber(o.at) or 0) <= at then
    redis.call('HDEL', KEYS[5], objs[i])
    if (tonumber(redis.call('ZSCORE', KEYS[7], objs[i])) or at) <= at then
      redis.call('ZADD', KEYS[7], at, objs[i])
    end
    n = n + 1
  end
end
-- `used`, recounted from the objects left
redis.call('DEL', KEYS[1])
local left = redis.call('HVALS', KEYS[5])
for _, raw in ipairs(left) do
  local o = cjson.decode(raw)
  apply(KEYS[1], o.ns, o.charge, 1)
end
if all then
  redis.call('DEL', KEYS[6])
else
  for _, f in ipairs(redis.call('HKEYS', KEYS[6])) do
    if string.sub(f, 1, #ns + 1) == ns .. '|' then redis.call('HDEL', KEYS[6], f) end
  end
end
return n
"""
)

_MARK_UNSETTLED = """
local raw = redis.call('HGET', KEYS[3], ARGV[1])
if not raw then return 0 end
local r = cjson.decode(raw)
if r.state ~= 'pending' then return 0 end
r.settle = ARGV[2]
redis.call('HSET', KEYS[3], ARGV[1], cjson.encode(r))
return 1
"""

_UNSETTLED = (
    _COMMON
    + """
purge(tonumber(ARGV[1]))
local out = {}
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  local r = cjson.decode(all[i + 1])
  if r.state == 'pending' and type(r.settle) == 'string' and r.settle ~= '' then
    table.insert(out, {all[i], all[i + 1], redis.call('ZSCORE', KEYS[4], all[i]) or '0'})
  end
end
return out
"""
)

_USAGE = (
    _COMMON
    + """
purge(tonumber(ARGV[1]))
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
        redis.call('HGETALL', KEYS[6])}
"""
)

_SET_LIMIT = """
if ARGV[2] == '' then redis.call('HDEL', KEYS[6], ARGV[1])
else redis.call('HSET', KEYS[6], ARGV[1], ARGV[2]) end
return 1
"""

_RECONCILE = (
    _COMMON
    + """
local now, started = tonumber(ARGV[1]), tonumber(ARGV[2])
local covered = {}
for _, r in ipairs(cjson.decode(ARGV[3])) do covered[r] = true end
local listing = cjson.decode(ARGV[4])
purge(now)
local before = redis.call('HGETALL', KEYS[1])
local added, removed, changed = 0, 0, 0
local objs = redis.call('HGETALL', KEYS[5])
for i = 1, #objs, 2 do
  local key = objs[i]
  local o = cjson.decode(objs[i + 1])
  if covered[o.res] then
    local l = listing[key]
    if l == nil then
      if o.at < started then redis.call('HDEL', KEYS[5], key); removed = removed + 1 end
    else
      if cjson.encode(l.charge) ~= cjson.encode(o.charge) then
        o.charge = l.charge
        redis.call('HSET', KEYS[5], key, cjson.encode(o))
        changed = changed + 1
      end
      listing[key] = nil
    end
  end
end
for key, l in pairs(listing) do
  local t = redis.call('ZSCORE', KEYS[7], key)
  if not (t and tonumber(t) >= started) then
    redis.call('HSET', KEYS[5], key,
      cjson.encode({ns = l.ns, res = l.res, charge = l.charge, at = started}))
    added = added + 1
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', '(' .. s(started))
redis.call('DEL', KEYS[1])
objs = redis.call('HGETALL', KEYS[5])
for i = 1, #objs, 2 do
  local o = cjson.decode(objs[i + 1])
  apply(KEYS[1], o.ns, o.charge, 1)
end
return {added, removed, changed, before, redis.call('HGETALL', KEYS[1])}
"""
)


SUFFIXES = ("used", "inprog", "res", "resexp", "objs", "limits", "tomb", "claims")


class RedisLedger(Ledger):
    def __init__(
        self,
        url: str,
        ttl_seconds: float,
        clock: Clock | None = None,
        prefix: str = QUOTA_REDIS_PREFIX,
        timeout: float = 2.0,
    ) -> None:
        super().__init__(ttl_seconds, clock)
        self.url = url
        self.prefix = prefix
        self.redis: RedisHandle = open_redis(url, timeout=timeout, decode_responses=True)
        c = self.client = self.redis.client
        self._reserve = c.register_script(_RESERVE)
        self._reserve_change = c.register_script(_RESERVE_CHANGE)
        self._commit_change = c.register_script(_COMMIT_CHANGE)
        self._commit = c.register_script(_COMMIT)
        self._release = c.register_script(_RELEASE)
        self._delete = c.register_script(_DELETE)
        self._delete_scope = c.register_script(_DELETE_SCOPE)
        self._usage = c.register_script(_USAGE)
        self._mark_unsettled = c.register_script(_MARK_UNSETTLED)
        self._unsettled = c.register_script(_UNSETTLED)
        self._set_limit = c.register_script(_SET_LIMIT)
        self._reconcile = c.register_script(_RECONCILE)

    def keys(self, tenant: str) -> list[str]:
        return [tenant_key(self.prefix, tenant, k) for k in SUFFIXES]

    async def _call(self, script: Any, tenant: str, args: list[Any]) -> Any:
        try:
            await self.redis.initialize()
            return await script(keys=self.keys(tenant), args=args)
        except ERRORS as exc:
            raise _error(exc) from exc

    async def ping(self) -> None:
        ok, state = await self.redis.state()
        if not ok:
            raise LedgerError("ledger unreachable", f"redis ledger {self.redis.name}: {state}")
        await self._heartbeat()

    async def _heartbeat(self) -> None:
        """A write under the prefix (a key that expires by itself): a Redis that answers
        but refuses writes (out of memory, a read-only replica) fails it."""
        try:
            await self.redis.initialize()
            await self.client.set(self.prefix + "heartbeat", repr(self.clock()), ex=60)
        except ERRORS as exc:
            detail = f"redis ledger: {error_text(exc)}"
            raise LedgerError("ledger refuses writes", detail) from exc

    async def ready(self) -> tuple[bool, str]:
        """The `/readyz` detail: the topology and its state, e.g. `ledger redis+cluster:
        3 masters ok`, `ledger redis+sentinel mymaster: master 10.0.0.5:6379 ok`,
        `ledger unavailable: redis+cluster: 2 of 3 masters reachable`,
        `ledger unavailable: redis 10.0.0.5:6379: ledger refuses writes` (the heartbeat
        write failed)."""
        ok, state = await self.redis.state()
        if ok:
            try:
                await self._heartbeat()
            except LedgerError as exc:
                ok, state = False, exc.reason
        return ok, f"ledger {'' if ok else 'unavailable: '}{self.redis.name}: {state}"

    async def close(self) -> None:
        await self.redis.close()

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
        now = self.clock()
        charge = {k: int(v) for k, v in charge.items() if v > 0}
        status, payload = await self._call(
            self._reserve,
            tenant,
            [
                repr(now),
                repr(now + self.ttl),
                reservation_id,
                namespace,
                _enc(charge),
                _enc(tenant_limits),
                _enc(namespace_limits),
                claim.key if claim else "",
                claim.fingerprint if claim else "",
            ],
        )
        if status == "refused":
            raise _refusal(tenant, namespace, payload)
        if status == "conflict":
            raise ClaimConflict(in_flight=payload == "inflight")
        if status == "replay":
            answer = Answer.decode(payload)
            if answer is not None:
                raise ClaimReplay(answer)
        return Reservation(reservation_id, tenant, namespace, charge, now)

    async def reserve_change(
        self,
        reservation: Reservation,
        obj: ObjectRef,
        new_charge: Mapping[str, int],
        base_charge: Mapping[str, int],
        tenant_limits: Mapping[str, int],
        namespace_limits: Mapping[str, int],
    ) -> Reservation:
        r = reservation
        new = {k: int(v) for k, v in new_charge.items() if v > 0}
        status, payload = await self._call(
            self._reserve_change,
            r.tenant,
            [
                repr(self.clock()),
                r.id,
                obj.key,
                _enc(new),
                _enc(base_charge),
                _enc(tenant_limits),
                _enc(namespace_limits),
            ],
        )
        if status == "refused":
            raise _refusal(r.tenant, r.namespace, payload)
        if status == "gone":
            raise LedgerError("reservation expired")
        return dataclasses.replace(r, charge=_charge(json.loads(payload)))

    async def commit_change(
        self, reservation: Reservation, obj: ObjectRef, new_charge: Mapping[str, int]
    ) -> None:
        r = reservation
        new = {k: int(v) for k, v in new_charge.items() if v > 0}
        await self._call(
            self._commit_change,
            r.tenant,
            [
                repr(self.clock()),
                r.id,
                obj.key,
                obj.namespace,
                _enc(new),
                obj.resource,
                repr(r.created),
            ],
        )

    async def commit(
        self,
        reservation: Reservation,
        name: str,
        resource: str,
        charge: Mapping[str, int] | None = None,
        answer: Answer | None = None,
    ) -> bool:
        r = reservation
        obj = ObjectRef(r.tenant, r.namespace, resource, name)
        made = {k: int(v) for k, v in (r.charge if charge is None else charge).items() if v > 0}
        result = await self._call(
            self._commit,
            r.tenant,
            [
                repr(self.clock()),
                r.id,
                obj.key,
                r.namespace,
                _enc(made),
                resource,
                answer.encode() if answer is not None else "",
                repr(r.created),
            ],
        )
        return bool(result)

    async def release(self, reservation: Reservation) -> None:
        await self._call(
            self._release,
            reservation.tenant,
            [reservation.id, repr(self.clock() + self.ttl)],
        )

    async def mark_unsettled(
        self, reservation: Reservation, obj: ObjectRef, release_after: float | None = None
    ) -> None:
        await self._call(
            self._mark_unsettled,
            reservation.tenant,
            [reservation.id, encode_mark(obj, release_after)],
        )

    async def unsettled(self, tenant: str) -> list[Unsettled]:
        rows = await self._call(self._unsettled, tenant, [repr(self.clock())])
        out = []
        for rid, raw, expires in rows:
            r = json.loads(raw)
            created = float(expires) - self.ttl
            reservation = Reservation(
                rid, tenant, r.get("ns", ""), _charge(r.get("charge")), created
            )
            out.append(decode_mark(reservation, r["settle"], float(expires)))
        return out

    async def delete(self, obj: ObjectRef, at: float | None = None) -> Charge | None:
        now = self.clock()
        raw = await self._call(
            self._delete,
            obj.tenant,
            [
                repr(now),
                obj.key,
                repr(TOMBSTONE_SECONDS),
                repr(now if at is None else at),
            ],
        )
        return _charge(json.loads(raw)) if raw else None

    async def delete_scope(
        self, tenant: str, namespace: str | None, at: float | None = None
    ) -> int:
        now = self.clock()
        n = await self._call(
            self._delete_scope,
            tenant,
            [
                repr(now),
                "1" if namespace is None else "0",
                namespace or "",
                repr(now if at is None else at),
            ],
        )
        return int(n)

    async def usage(self, tenant: str) -> Usage:
        used, inprog, limits = await self._call(self._usage, tenant, [repr(self.clock())])
        return Usage(_nest(used), _nest(inprog), _nest(limits))

    async def set_limit(self, tenant: str, namespace: str, resource: str, hard: int | None) -> None:
        await self._call(
            self._set_limit,
            tenant,
            [
                f"{namespace}|{resource}",
                "" if hard is None else str(int(hard)),
            ],
        )

    async def tenants(self) -> list[str]:
        """Every tenant with a key here, found by a SCAN of every master (no index key
        that one node would hold for all tenants, or a failover could lose)."""
        start = tenant_key(self.prefix, "", "")[: -len("}:")]  # `{prefix}{`
        found: set[str] = set()
        try:
            async for key in self.redis.scan(_glob_escape(start) + "*}:*"):
                tenant, sep, suffix = key[len(start) :].rpartition("}:")
                if sep and suffix in SUFFIXES and tenant:
                    found.add(tenant)
        except ERRORS as exc:
            raise _error(exc) from exc
        return sorted(found)

    async def reconcile_set(
        self,
        tenant: str,
        resources: list[str],
        objects: Mapping[ObjectRef, Charge],
        started_at: float,
    ) -> ReconcileResult:
        listing = {
            o.key: {"ns": o.namespace, "res": o.resource, "charge": dict(ch)}
            for o, ch in objects.items()
            if o.tenant == tenant
        }
        added, removed, changed, before, after = await self._call(
            self._reconcile,
            tenant,
            [
                repr(self.clock()),
                repr(started_at),
                json.dumps(list(resources)),
                json.dumps(listing) if listing else "{}",
            ],
        )
        return ReconcileResult(
            int(added),
            int(removed),
            int(changed),
            _nest(before).get(TENANT_SCOPE, {}),
            _nest(after).get(TENANT_SCOPE, {}),
        )


def _error(exc: BaseException) -> LedgerError:
    # A cluster that is down or failing over answers with errors: it is unreachable.
    error = isinstance(exc, ResponseError) and not isinstance(exc, ClusterError)
    reason = "ledger error" if error else "ledger unreachable"
    # Unreachable: the script may have been sent and may run yet (DESIGN §7).
    return LedgerError(reason, f"redis ledger: {error_text(exc)}", ambiguous=not error)


def _refusal(tenant: str, namespace: str, payload: str) -> QuotaExceeded:
    scope, res, n, used, inprog, hard = json.loads(payload)
    return QuotaExceeded(scope, tenant, namespace, res, int(n), int(used), int(inprog), int(hard))


def _enc(mapping: Mapping[str, int]) -> str:
    # cjson decodes "{}" and "[]" alike; an empty mapping must stay an (empty) object.
    return json.dumps(dict(mapping)) if mapping else "{}"


def _charge(raw: Any) -> Charge:
    return {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def _nest(flat: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for i in range(0, len(flat), 2):
        scope, res = split_field(flat[i])
        amount = int(flat[i + 1])
        out.setdefault(scope, {})[res] = amount
    return out


def _glob_escape(text: str) -> str:
    """`text` matched literally in a SCAN pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)

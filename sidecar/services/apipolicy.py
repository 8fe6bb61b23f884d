"""Following the store's policy objects (DESIGN §5 "Policy objects through the API").

Every sidecar process follows the RBAC objects (Role, RoleBinding, TenantRole,
TenantRoleBinding) and namespace ResourceQuotas stored in the backing store, as a
`system` client straight to the upstream, so a replica that never saw a write enforces
it too:

- per kind, a watch is opened first (the store registers it before it answers), then
  the kind is listed; the list replaces what was known of that kind, and the watch's
  events newer than the list (`resourceVersion`) are applied after it. A watch that
  ends or breaks is opened again and the kind listed again (after a short pause while
  the store cannot be read).
- changes are coalesced; the tenants they touch are compiled again (and only they),
  then joined with the files' policy (`sidecar/policy/source/api.py`) off the event
  loop, and the joined bundle is swapped in as on a file reload: open watches are
  decided again, the revision (`/readyz`, audit, metrics) covers both sources.
- `/readyz` is not ready until every kind was loaded once; later, a store that cannot
  be read keeps the last loaded set in force, and `/readyz` says so. An object that
  does not validate is skipped (one log line naming it, a count in `/readyz`), never
  blocking the rest.
- A kind the upstream does not serve (404) counts as loaded and empty, noted in
  `/readyz`, and is asked for again every minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp

from sidecar.core.target import is_dns1123_label
from sidecar.policy.source.api import (
    KINDS,
    NAMESPACED,
    ApiLayer,
    ObjectKey,
    StoredObject,
    TenantUnit,
    compile_tenant,
    compose_bundle,
    resolve,
)
from sidecar.policy.source.bundle import PolicyBundle
from sidecar.policy.source.store import PolicyStore

log = logging.getLogger("sidecar.apipolicy")

SYSTEM_HEADERS = {
    "X-Remote-User": "system:sidecar-policy",
    "X-Remote-Tenant": "system",
    "Accept": "application/json",
}
NOT_SERVED_RETRY_SECONDS = 60.0
WATCH_SECONDS = 300
MIN_WATCH_SECONDS = 1.0
MAX_EVENT_BYTES = 4 * 1024 * 1024
LOG_EVERY_SECONDS = 30.0


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def is_dns1123_subdomain(value: str) -> bool:
    return _NAME.match(value) is not None


class Unreadable(Exception):
    """The store could not be read (answer, network, or a broken watch)."""


class WatchEnded(Exception):
    """The store ended a watch cleanly (its timeout, a restart): list again."""


def _path(group: str, resource: str) -> str:
    return f"/apis/{group}/v1/{resource}" if group else f"/api/v1/{resource}"


class ApiPolicyFollower:
    def __init__(
        self,
        upstream: str,
        store: PolicyStore,
        install: Callable[[PolicyBundle], None],
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        retry_seconds: float = 1.0,
        start_wait_seconds: float = 3.0,
    ) -> None:
        self.upstream = upstream
        self.store = store
        self.install = install
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.retry_seconds = retry_seconds
        self.start_wait_seconds = start_wait_seconds
        self.objects: dict[ObjectKey, StoredObject] = {}
        self.by_tenant: dict[str, dict[ObjectKey, StoredObject]] = {}
        self.layer = ApiLayer()
        self.notes: list[str] = []
        self.loaded: set[str] = set()
        self.not_served: set[str] = set()
        self.failing: dict[str, tuple[float, str]] = {}
        self.broken_identity: dict[ObjectKey, str] = {}
        self.ready_event = asyncio.Event()
        self.applied = 0  # joined bundles swapped in (for tests and metrics)
        self._digest = 0
        self._dirty: set[str] = set()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._last_log: dict[str, float] = {}

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            return
        connector: aiohttp.BaseConnector
        if self.upstream.startswith("unix:"):
            connector = aiohttp.UnixConnector(path=self.upstream[len("unix:") :])
            self._base = "http://localhost"
        else:
            connector = aiohttp.TCPConnector(limit=0)
            self._base = self.upstream.rstrip("/")
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-policy")
        self.store.layer = self.join
        self.store.prepare = self.prepare
        self._tasks.append(asyncio.create_task(self._apply_loop(), name="api-policy-apply"))
        for (group, resource), kind in KINDS.items():
            self._tasks.append(
                asyncio.create_task(
                    self._follow(kind, _path(group, resource)), name=f"follow-{kind}"
                )
            )
        # Start serving with the objects in force when the store answers at once; a
        # store that does not keeps /readyz not ready until they are loaded.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ready_event.wait(), self.start_wait_seconds)

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def join(self, files: PolicyBundle) -> PolicyBundle:
        """The files' bundle joined with the API objects in force (the store calls it
        on every file reload)."""
        bundle, notes = compose_bundle(files, self.layer)
        self._set_notes(notes)
        return bundle

    def prepare(self, files: PolicyBundle) -> None:
        """In the reload thread: every tenant's share resolved against the new files,
        so that `join` on the event loop only merges."""
        for unit in list(self.layer.units.values()):
            resolve(unit, files.engine)

    # -- readiness -------------------------------------------------------------------

    async def ready(self) -> tuple[bool, str]:
        missing = len(KINDS) - len(self.loaded)
        failing = ""
        if self.failing:
            since = min(t for t, _ in self.failing.values())
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
            failing = f"the store cannot be read since {at}"
        if missing:
            detail = f"API policy objects not loaded yet ({missing} kind(s) pending)"
            return False, f"{detail}; {failing}" if failing else detail
        detail = f"{len(self.objects)} API policy object(s) loaded"
        if failing:
            detail += f"; {failing}: the last loaded set stays in force"
        if self.not_served:
            detail += f"; {len(self.not_served)} kind(s) not served by the upstream"
        broken = len(self.notes) + len(self.broken_identity)
        if broken:
            detail += f"; {broken} object(s) skipped as broken (see the log)"
        return True, detail

    # -- following one kind ----------------------------------------------------------

    async def _follow(self, kind: str, path: str) -> None:
        while True:
            began = time.monotonic()
            try:
                wait = await self._list_and_watch(kind, path)
            except asyncio.CancelledError:
                raise
            except WatchEnded:
                # The store's own end of a watch: list again at once, unless watches
                # end as soon as they open (an upstream that cannot stream one).
                quick = time.monotonic() - began < MIN_WATCH_SECONDS
                wait = self.retry_seconds if quick else 0.0
            except Exception as exc:
                reason = str(exc) if isinstance(exc, Unreadable) else type(exc).__name__
                if kind not in self.failing:
                    self.failing[kind] = (time.time(), reason)
                self._log_once(kind, "cannot follow %s objects in the store (%s); retrying", reason)
                wait = self.retry_seconds
            await asyncio.sleep(wait)

    async def _list_and_watch(self, kind: str, path: str) -> float:
        """List (in force at once), open the watch, list again once the store has
        registered it (so no change falls between the list and the watch), then apply
        the watch's newer events until it ends."""
        session = self._session
        assert session is not None
        url = self._base + path
        items, _ = await self._list(session, url)
        if items is None:
            self._not_served(kind)
            return NOT_SERVED_RETRY_SECONDS
        self._loaded(kind, items)
        # The store ends each watch after WATCH_SECONDS (then the kind is listed again);
        # a connection that went silent without closing is given up a little later.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.connect_timeout, sock_read=WATCH_SECONDS + 30
        )
        params = {"watch": "1", "timeoutSeconds": str(WATCH_SECONDS)}
        try:
            watch = await asyncio.wait_for(
                session.get(url, params=params, headers=SYSTEM_HEADERS, timeout=timeout),
                self.read_timeout,
            )
        except TimeoutError:
            raise Unreadable("the watch was not answered in time") from None
        async with watch:
            if watch.status != 200:
                raise Unreadable(f"the watch answered {watch.status}")
            items, list_rv = await self._list(session, url)
            if items is None:
                raise Unreadable("the list is gone")
            self._loaded(kind, items)
            await self._consume(kind, watch, list_rv)
        raise WatchEnded()

    def _loaded(self, kind: str, items: list[Any]) -> None:
        self.not_served.discard(kind)
        self._replace(kind, items)
        self.loaded.add(kind)
        self.failing.pop(kind, None)
        self._check_ready()

    async def _list(self, session: aiohttp.ClientSession, url: str) -> tuple[Any, int]:
        timeout = aiohttp.ClientTimeout(total=self.read_timeout, sock_connect=self.connect_timeout)
        async with session.get(url, headers=SYSTEM_HEADERS, timeout=timeout) as resp:
            if resp.status == 404:
                return None, 0
            if resp.status != 200:
                raise Unreadable(f"the list answered {resp.status}")
            raw = await resp.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            raise Unreadable("the list is not JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
            return None, 0
        meta = doc.get("metadata")
        rv = _int(meta.get("resourceVersion")) if isinstance(meta, dict) else 0
        return doc["items"], rv

    async def _consume(self, kind: str, watch: aiohttp.ClientResponse, list_rv: int) -> None:
        buffer = b""
        async for chunk in watch.content.iter_any():
            buffer += chunk
            if len(buffer) > MAX_EVENT_BYTES and b"\n" not in buffer:
                raise Unreadable("a watch event is too large")
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    self._event(kind, line, list_rv)

    def _event(self, kind: str, line: bytes, list_rv: int) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            raise Unreadable("a watch event is not JSON") from None
        if not isinstance(event, dict):
            raise Unreadable("a watch event is not an object")
        kind_of_event = event.get("type")
        obj = event.get("object")
        if kind_of_event == "BOOKMARK":
            return
        if kind_of_event == "ERROR" or not isinstance(obj, dict):
            raise Unreadable("the watch reported an error")
        meta = obj.get("metadata")
        rv = _int(meta.get("resourceVersion")) if isinstance(meta, dict) else 0
        if rv and rv <= list_rv:
            return  # already in the list
        if kind_of_event in ("ADDED", "MODIFIED"):
            self._put(kind, obj)
        elif kind_of_event == "DELETED":
            stored = self._identify(kind, obj)
            if stored is not None:
                self._remove(stored.key)
        else:
            raise Unreadable("a watch event of an unknown type")

    # -- the objects known -----------------------------------------------------------

    def _identify(self, kind: str, obj: Mapping[str, Any]) -> StoredObject | None:
        """The object's identity as the store keyed it; None (logged, counted) when
        it has none a policy object can have."""
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return None
        name, tenant = meta.get("name"), meta.get("tenant")
        namespace = meta.get("namespace") if kind in NAMESPACED else ""
        ok = (
            isinstance(name, str)
            and is_dns1123_subdomain(name)
            and isinstance(tenant, str)
            and is_dns1123_label(tenant)
            and isinstance(namespace, str)
            and (kind not in NAMESPACED or is_dns1123_label(namespace))
        )
        if not ok:
            key = (kind, str(tenant), str(namespace), str(name))
            if key not in self.broken_identity:
                self.broken_identity[key] = "no valid name, tenant or namespace"
                log.warning("skipping a %s object of the store without a valid identity", kind)
            return None
        rv = meta.get("resourceVersion")
        return StoredObject(kind, str(tenant), str(namespace), str(name), obj, str(rv or ""))

    def _put(self, kind: str, obj: Mapping[str, Any]) -> None:
        stored = self._identify(kind, obj)
        if stored is None:
            return
        old = self.objects.get(stored.key)
        if old is not None:
            if old.resource_version == stored.resource_version and old.body == stored.body:
                return
            self._digest ^= _hash(old)
        self.objects[stored.key] = stored
        self.by_tenant.setdefault(stored.tenant, {})[stored.key] = stored
        self._digest ^= _hash(stored)
        self._mark(stored.tenant)

    def _remove(self, key: ObjectKey) -> None:
        old = self.objects.pop(key, None)
        if old is None:
            return
        self._digest ^= _hash(old)
        tenant_objects = self.by_tenant.get(old.tenant)
        if tenant_objects is not None:
            tenant_objects.pop(key, None)
            if not tenant_objects:
                del self.by_tenant[old.tenant]
        self._mark(old.tenant)

    def _replace(self, kind: str, items: list[Any]) -> None:
        """A fresh list of one kind: what it holds is in force, what it lacks is gone."""
        seen: set[ObjectKey] = set()
        for obj in items:
            if isinstance(obj, dict):
                self._put(kind, obj)
                stored = self._identify(kind, obj)
                if stored is not None:
                    seen.add(stored.key)
        for key in [k for k in self.objects if k[0] == kind and k not in seen]:
            self._remove(key)

    def _not_served(self, kind: str) -> None:
        if kind not in self.not_served:
            log.info("the upstream does not serve %s objects; none are in force", kind)
        self.not_served.add(kind)
        self._replace(kind, [])
        self.loaded.add(kind)
        self.failing.pop(kind, None)
        self._check_ready()

    def _mark(self, tenant: str) -> None:
        self._dirty.add(tenant)
        self._changed.set()

    def _check_ready(self) -> None:
        if len(self.loaded) == len(KINDS):
            self._changed.set()  # the first load is swapped in even when empty

    # -- compiling and swapping in ---------------------------------------------------

    async def _apply_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._changed.wait()
            self._changed.clear()
            if len(self.loaded) < len(KINDS):
                continue  # nothing goes in force before every kind was loaded once
            dirty, self._dirty = self._dirty, set()
            if not dirty and self.ready_event.is_set():
                continue  # a list that changed nothing
            snapshot = {t: list(self.by_tenant.get(t, {}).values()) for t in dirty}
            count, digest = len(self.objects), self._digest
            try:
                compiled = await loop.run_in_executor(self._executor, _compile, snapshot)
                units = dict(self.layer.units)
                for tenant, unit in compiled.items():
                    if unit is None:
                        units.pop(tenant, None)
                    else:
                        units[tenant] = unit
                layer = ApiLayer(units, f"{digest:016x}"[:12] if count else "", count)
                while True:
                    files = self.store.files
                    bundle, notes = await loop.run_in_executor(self._executor, _join, files, layer)
                    if self.store.files is files:
                        break  # else a file reload came in between: join again
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("joining the API policy objects failed; the last set stays")
                self._dirty |= dirty
                await asyncio.sleep(self.retry_seconds)
                self._changed.set()
                continue
            self.layer = layer
            self._set_notes(notes)
            self.applied += 1
            self.install(bundle)
            if not self.ready_event.is_set():
                self.ready_event.set()
                log.info("API policy objects loaded: %d object(s)", count)

    def _set_notes(self, notes: list[str]) -> None:
        fresh = [n for n in notes if n not in set(self.notes)]
        for note in fresh[:20]:
            log.warning("API policy object skipped: %s", note)
        self.notes = notes

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
            self._last_log[key] = now
            log.warning(message, key, *args)


def _join(files: PolicyBundle, layer: ApiLayer) -> tuple[PolicyBundle, list[str]]:
    """`compose_bundle`, then the new objects frozen out of the collector's scans (as a
    file reload does, `sidecar/policy/source/reload.py`): a joined policy holds no
    reference cycles, so a retired one is still freed by reference counting."""
    joined = compose_bundle(files, layer)
    gc.freeze()
    return joined


def _compile(snapshot: Mapping[str, list[StoredObject]]) -> dict[str, TenantUnit | None]:
    return {t: compile_tenant(t, objs) if objs else None for t, objs in snapshot.items()}


def _hash(obj: StoredObject) -> int:
    key = "\0".join((*obj.key, obj.resource_version)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


__all__ = ["ApiPolicyFollower"]

"""The HTTP service of the reference backing store (DESIGN §10).

One catch-all aiohttp route: the URL is parsed with `sidecar.target.parse_target`
(the same grammar the sidecar uses), the resource type comes from `resources.py`, and
the verb picks a handler. Errors are Kubernetes Status bodies from `sidecar.errors`;
a missing tenant answers exactly `tenant_not_found(t)`, the body the sidecar uses to
conceal other tenants. The service trusts `X-Remote-Tenant` (set by the sidecar) to
resolve short paths; `assume_tenant` (off by default) stands in for a missing header.

Kubernetes client compatibility (DESIGN §10) lives in its own modules: discovery
documents (`discovery.py`), selectors (`selectors.py`), `dryRun` (`dryrun.py`, run as a
rolled-back transaction), PATCH types (`patch.py`) and JSON-only bodies (`bodies.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from dataclasses import field as dc_field
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiohttp import web

from sidecar.target import (
    DEFAULT_TENANT,
    SYSTEM_TENANT,
    RequestTarget,
    Scope,
    TargetError,
    is_dns1123_label,
    parse_target,
)

from . import baremetal, discovery, tags
from .bodies import (
    MAX_BODY_BYTES,
    check_media_type,
    json_response,
    raw_response,
    read_body,
    read_json,
    read_object,
)
from .dryrun import is_dry_run
from .errors import StatusError, bad_request, not_found, tenant_not_found
from .patch import JSON_PATCH, json_patch, merge_patch
from .resources import (
    ALLOCATIONS,
    CLUSTER,
    NAMESPACE,
    NAMESPACES,
    NODES,
    SERVERS,
    TENANT,
    TENANTS,
    ResourceType,
    lookup,
    namespaced,
    under_tenant,
)
from .selectors import Selector, from_query, validate_labels
from .storage import Clause, Obj, Store, decode_continue, dumps, encode_continue
from .watch import Hub

log = logging.getLogger("backing_store")

RESERVED_TENANTS = (SYSTEM_TENANT, DEFAULT_TENANT)
INITIAL_NAMESPACES = (DEFAULT_TENANT, SYSTEM_TENANT)
STORE_KEY = web.AppKey("store", Store)
HUB_KEY = web.AppKey("hub", Hub)
_DNS1123_SUBDOMAIN_MAX = 253
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_HEALTH = ("/healthz", "/readyz", "/livez")
T = TypeVar("T")


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that must finish without suspending (no I/O, no other task
    runs meanwhile): how a dry-run transaction spans an async handler safely."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a handler suspended inside a dry-run transaction")


def is_dns1123_subdomain(value: str) -> bool:
    return 0 < len(value) <= _DNS1123_SUBDOMAIN_MAX and all(
        is_dns1123_label(part) for part in value.split(".")
    )


@dataclass(frozen=True, slots=True)
class Loc:
    """Where a request points in the store: a type, its tenant/namespace, a name."""

    rt: ResourceType
    tenant: str | None
    namespace: str | None
    name: str

    @property
    def key(self) -> str:
        return self.rt.key(self.tenant, self.namespace, self.name)

    @property
    def prefix(self) -> str:
        return self.rt.prefix(self.tenant, self.namespace)

    @property
    def own_level(self) -> bool:
        """A collection at the type's own scope (where objects are created)."""
        if self.rt.scope == TENANT:
            return self.tenant is not None
        if self.rt.scope == NAMESPACE:
            return self.namespace is not None
        return True


@dataclass(frozen=True, slots=True)
class ListFilter:
    """The filters of a list, watch or deletecollection: `owner`, tags, selectors."""

    owner: str | None = None
    tags: dict[str, list[str]] = dc_field(default_factory=dict)
    selector: Selector = dc_field(default_factory=Selector)

    def clauses(self) -> list[Clause]:
        return tags.filter_clauses(self.tags) + self.selector.clauses()

    def matches(self, obj: Obj) -> bool:
        if self.owner is not None and (obj.get("spec") or {}).get("owner") != self.owner:
            return False
        if self.tags and not tags.matches(set(obj.get("tags") or []), self.tags):
            return False
        return self.selector.matches(obj)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Service:
    def __init__(self, store: Store, hub: Hub, assume_tenant: str | None = None) -> None:
        self.store = store
        self.hub = hub
        self.assume_tenant = assume_tenant
        self._seed()

    # -- setup --------------------------------------------------------------------

    def _seed(self) -> None:
        """`system` and `default` exist from the start, each with its namespaces."""
        with self.store.tx():
            for tenant in RESERVED_TENANTS:
                if not self.store.exists(TENANTS.key(None, None, tenant)):
                    self._create_tenant(tenant, {"metadata": {"name": tenant}})

    def _create_tenant(self, name: str, obj: Obj) -> Obj:
        with self.store.tx():
            obj = self._stamp(obj, TENANTS, None, None, name)
            self.store.write(TENANTS.key(None, None, name), obj, create=True)
            for ns in INITIAL_NAMESPACES:
                nobj: Obj = {"metadata": {"name": ns}}
                nobj = self._stamp(nobj, NAMESPACES, name, None, ns)
                self.store.write(NAMESPACES.key(name, None, ns), nobj, create=True)
        return obj

    # -- entry point --------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except StatusError as exc:
            return exc.response()
        except TargetError as exc:
            return StatusError(exc.code, exc.message).response()
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("unexpected error on %s %s", request.method, request.raw_path)
            return StatusError(500, "internal error in the backing store").response()

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        # The sidecar names a list's target after its `fieldSelector` (for resourceNames
        # rules); the store addresses by path alone and applies selectors itself.
        target = parse_target(request.method, request.raw_path, _without_field_selector(request))
        if not target.resource_request:
            return self._non_resource(request, target)
        write = request.method in _WRITE_METHODS
        if write:
            check_media_type(request)
        if target.short_path:
            caller = request.headers.get("X-Remote-Tenant", "") or self.assume_tenant
            if not caller:
                raise bad_request(
                    "a path without tenants/{tenant} needs the X-Remote-Tenant header"
                )
            target = target.resolve_tenant(caller)
        loc = self._locate(target)
        if loc.tenant is not None and not self.store.exists(TENANTS.key(None, None, loc.tenant)):
            raise tenant_not_found(loc.tenant)

        if write and await self._dry_run(request):
            with self.store.tx(dry_run=True):
                return run_inline(self._act(request, target, loc))
        return await self._act(request, target, loc)

    def _non_resource(self, request: web.Request, target: RequestTarget) -> web.Response:
        path = target.path.split("?", 1)[0]
        if path in _HEALTH:
            return web.Response(text="ok")
        if request.method in ("GET", "HEAD") and path == "/openapi/v2":
            return web.Response(body=b"", content_type=discovery.OPENAPI_V2_PROTOBUF)
        if request.method in ("GET", "HEAD") and "%" not in path:
            doc = discovery.document(path.strip("/").split("/"), request.host)
            if doc is not None:
                return json_response(doc)
        raise StatusError(404, f"the server could not find the requested resource ({path})")

    async def _dry_run(self, request: web.Request) -> bool:
        """Read the body up front (a dry run then never waits on the network inside its
        transaction) and tell whether this write is a dry run; 400 for a bad value."""
        raw = await read_body(request)
        options: Any = None
        if request.method == "DELETE" and raw.strip():
            options = await read_json(request)
            if not isinstance(options, dict):
                raise bad_request("a DELETE body must be a DeleteOptions JSON object")
        return is_dry_run(request, options)

    async def _act(
        self, request: web.Request, target: RequestTarget, loc: Loc
    ) -> web.StreamResponse:
        if target.subresource:
            return await self._subresource(request, target, loc)
        verb = target.verb
        if verb == "get":
            return self._get(loc)
        if verb == "list":
            return self._list(request, loc)
        if verb == "watch":
            return await self._watch(request, loc)
        if verb == "create":
            return await self._create(request, loc)
        if verb in ("update", "patch"):
            return await self._update(request, loc, patch=verb == "patch")
        if verb == "delete":
            return self._delete(loc)
        if verb == "deletecollection":
            return self._delete_collection(request, loc)
        raise StatusError(405, f"{request.method} is not allowed here")

    def _locate(self, target: RequestTarget) -> Loc:
        rt = lookup(target.api_group, target.api_version, target.resource)
        if rt is None:
            gv = (
                f"{target.api_group}/{target.api_version}"
                if target.api_group
                else (target.api_version)
            )
            raise StatusError(
                404,
                f"the server could not find the requested resource ({target.resource} in {gv})",
                details={"group": target.api_group, "kind": target.resource},
            )
        name = target.name
        if rt is TENANTS or rt.scope == CLUSTER:
            if target.scope != Scope.CLUSTER:
                raise StatusError(
                    404, f"{rt.plural} is cluster-scoped: it has no tenant or namespace"
                )
            return Loc(rt, None, None, name)
        if rt.scope == TENANT:
            if target.scope == Scope.TENANT:
                return Loc(rt, target.tenant, None, name)
            if target.scope == Scope.CLUSTER and not name:
                return Loc(rt, None, None, "")
            raise StatusError(
                404, f"{rt.plural} is tenant-scoped: use .../tenants/{{tenant}}/{rt.plural}"
            )
        if target.scope == Scope.NAMESPACE:
            return Loc(rt, target.tenant, target.namespace, name)
        if not name:
            tenant = target.tenant if target.scope == Scope.TENANT else None
            return Loc(rt, tenant, None, "")
        raise StatusError(
            404,
            f"{rt.plural} is namespace-scoped: use "
            f".../tenants/{{tenant}}/namespaces/{{namespace}}/{rt.plural}/{name}",
        )

    def _missing(self, loc: Loc) -> StatusError:
        if loc.rt is TENANTS:
            return tenant_not_found(loc.name)
        return not_found(loc.rt.plural, loc.name)

    def _require_namespace(self, loc: Loc) -> None:
        if loc.rt.scope == NAMESPACE and loc.namespace is not None:
            assert loc.tenant is not None
            if not self.store.exists(NAMESPACES.key(loc.tenant, None, loc.namespace)):
                raise not_found("namespaces", loc.namespace)

    # -- reads --------------------------------------------------------------------

    def _get(self, loc: Loc) -> web.Response:
        raw = self.store.get_raw(loc.key)
        if raw is None:
            raise self._missing(loc)
        return raw_response(raw)

    def _filters(self, request: web.Request, loc: Loc) -> ListFilter:
        query = request.query
        filters = tags.parse_filters(query)
        if filters and loc.rt is not SERVERS:
            raise bad_request("tag filters apply to servers only")
        return ListFilter(query.get("owner") or None, filters, from_query(query))

    def _list(self, request: web.Request, loc: Loc) -> web.Response:
        query = request.query
        limit: int | None = None
        if "limit" in query:
            text = query["limit"]
            if not text.isdigit() or int(text) <= 0:
                raise bad_request(f"limit must be a positive integer, not {text!r}")
            limit = int(text)
        filters = self._filters(request, loc)
        prefix = loc.prefix
        after = decode_continue(query["continue"], prefix) if query.get("continue") else None
        page = self.store.scan(
            prefix, limit=limit, after=after, owner=filters.owner, where=filters.clauses()
        )
        meta: dict[str, Any] = {"resourceVersion": str(self.store.resource_version)}
        if page.more and page.last_key is not None:
            meta["continue"] = encode_continue(page.last_key)
        head = dumps({"kind": loc.rt.list_kind, "apiVersion": loc.rt.api_version, "metadata": meta})
        return raw_response(head[:-1] + ',"items":[' + ",".join(page.rows) + "]}")

    async def _watch(self, request: web.Request, loc: Loc) -> web.StreamResponse:
        filters = self._filters(request, loc)
        timeout: float | None = None
        if "timeoutSeconds" in request.query:
            text = request.query["timeoutSeconds"]
            if not text.isdigit():
                raise bad_request("timeoutSeconds must be a non-negative integer")
            timeout = float(text)
        prefix, exact = loc.prefix, (loc.key if loc.name else None)

        def wants(key: str, obj: Obj) -> bool:
            if exact is not None:
                if key != exact:
                    return False
            elif not key.startswith(prefix):
                return False
            return filters.matches(obj)

        initial: list[str] = []
        if request.query.get("resourceVersion") == "0":
            # Kubernetes' "start at any": the current objects first, as ADDED events
            # (kubectl's `get NAME --watch` drops that first event). Scanned with no await
            # before the watcher is registered, so no change falls in between.
            page = self.store.scan(
                prefix, owner=filters.owner, where=filters.clauses(), exact=exact
            )
            initial = ['{"type":"ADDED","object":' + raw + "}\n" for raw in page.rows]
        return await self.hub.stream(request, wants, timeout, initial)

    # -- writes -------------------------------------------------------------------

    def _stamp(
        self, obj: Obj, rt: ResourceType, tenant: str | None, namespace: str | None, name: str
    ) -> Obj:
        """The object with kind, apiVersion and system metadata set (kind first)."""
        obj = {"kind": rt.kind, "apiVersion": rt.api_version, **obj}
        obj["kind"] = rt.kind
        obj["apiVersion"] = rt.api_version
        meta = obj["metadata"] = dict(obj.get("metadata") or {})
        meta["name"] = name
        if rt.scope != CLUSTER:
            meta["tenant"] = tenant
        else:
            meta.pop("tenant", None)
        if rt.scope == NAMESPACE:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        return obj

    def _check_body(self, obj: Obj, loc: Loc, *, name: str | None) -> str:
        """Validate metadata against the URL; returns the object's name."""
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        body_name = meta.get("name")
        if body_name is None or body_name == "":
            if name is None:
                raise bad_request("metadata.name is required")
            body_name = name
        if not isinstance(body_name, str):
            raise bad_request("metadata.name must be a string")
        label_only = loc.rt in (TENANTS, NAMESPACES)
        valid = is_dns1123_label(body_name) if label_only else is_dns1123_subdomain(body_name)
        if not valid:
            raise bad_request(
                f"metadata.name {body_name!r} is not a valid DNS-1123 "
                f"{'label' if label_only else 'subdomain'} name"
            )
        if name is not None and body_name != name:
            raise bad_request(f"metadata.name {body_name!r} does not match the URL ({name!r})")
        for field, want in (("tenant", loc.tenant), ("namespace", loc.namespace)):
            got = meta.get(field)
            if got in (None, ""):
                continue
            in_scope = (field == "tenant" and loc.rt.scope != CLUSTER) or (
                field == "namespace" and loc.rt.scope == NAMESPACE
            )
            if in_scope and got != want:
                raise bad_request(f"metadata.{field} {got!r} does not match the URL ({want!r})")
        if "tags" in obj and loc.rt is not SERVERS:
            raise bad_request(f"{loc.rt.plural} do not take tags")
        validate_labels(meta.get("labels"))
        return body_name

    async def _create(self, request: web.Request, loc: Loc) -> web.Response:
        if loc.name:
            raise StatusError(405, "POST goes to the collection, not to an item")
        if not loc.own_level:
            raise StatusError(
                405, f"create {loc.rt.plural} in a {loc.rt.scope}: the URL names no {loc.rt.scope}"
            )
        obj = await read_object(request)
        name = self._check_body(obj, loc, name=None)
        item = Loc(loc.rt, loc.tenant, loc.namespace, name)
        new_tags = tags.validate_tags(obj["tags"]) if "tags" in obj else None
        if loc.rt is SERVERS:
            obj["tags"] = new_tags or []
        if loc.rt is TENANTS:
            if name in RESERVED_TENANTS:
                raise StatusError(
                    403, f"tenant {name!r} is reserved: it always exists and cannot be created"
                )
            if self.store.exists(item.key):
                raise StatusError(409, f'tenants "{name}" already exists', "AlreadyExists")
            obj = self._create_tenant(name, obj)
            return json_response(obj, status=201)
        self._require_namespace(loc)
        if self.store.exists(item.key):
            raise StatusError(
                409,
                f'{loc.rt.plural} "{name}" already exists',
                "AlreadyExists",
                details={"name": name, "kind": loc.rt.plural},
            )
        obj = self._stamp(obj, loc.rt, loc.tenant, loc.namespace, name)
        with self.store.tx():
            if loc.rt is ALLOCATIONS:
                assert loc.tenant is not None
                baremetal.allocate(self.store, loc.tenant, obj)
            self.store.write(item.key, obj, create=True, tags=new_tags)
        return json_response(obj, status=201)

    async def _update(self, request: web.Request, loc: Loc, *, patch: bool) -> web.Response:
        if not loc.name:
            raise StatusError(405, f"{request.method} needs an item, not a collection")
        json_ops = patch and request.content_type == JSON_PATCH
        body: Any = await (read_json(request) if json_ops else read_object(request))
        current = self.store.get(loc.key)
        if current is None:
            raise self._missing(loc)
        cur_meta = current["metadata"]
        if json_ops:
            # a JSON patch states its preconditions with `test` operations
            want_rv = None
            obj = json_patch(current, body)
            sets_tags = isinstance(obj, dict) and obj.get("tags") != current.get("tags")
        else:
            body_meta = body.get("metadata")
            want_rv = body_meta.get("resourceVersion") if isinstance(body_meta, dict) else None
            obj = merge_patch(current, body) if patch else body
            sets_tags = "tags" in body
        if not isinstance(obj, dict):
            raise bad_request("the patched object is not a JSON object")
        self._check_body(obj, loc, name=loc.name)
        if want_rv not in (None, "") and str(want_rv) != cur_meta["resourceVersion"]:
            raise StatusError(
                409,
                f'Operation cannot be fulfilled on {loc.rt.plural} "{loc.name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
                "Conflict",
            )
        new_tags: list[str] | None = None
        if loc.rt is SERVERS:
            if sets_tags:
                new_tags = tags.validate_tags(obj.get("tags") or [])
                obj["tags"] = new_tags
            else:
                obj["tags"] = current.get("tags") or []
        meta = obj["metadata"]
        meta["uid"] = cur_meta.get("uid")
        meta["creationTimestamp"] = cur_meta.get("creationTimestamp")
        obj = self._stamp(obj, loc.rt, loc.tenant, loc.namespace, loc.name)
        self.store.write(loc.key, obj, create=False, tags=new_tags)
        return json_response(obj)

    def _delete(self, loc: Loc) -> web.Response:
        if loc.rt is TENANTS and loc.name in RESERVED_TENANTS:
            raise StatusError(
                403, f"tenant {loc.name!r} is reserved: it always exists and cannot be deleted"
            )
        with self.store.tx():
            obj = self._delete_one(loc)
        return json_response(obj)

    def _delete_one(self, loc: Loc) -> Obj:
        """Delete one object and everything it contains (inside a transaction)."""
        store = self.store
        if loc.rt is TENANTS:
            if not store.exists(loc.key):
                raise self._missing(loc)
            self._release_allocations(store.scan(ALLOCATIONS.prefix(loc.name)).rows, loc.name)
            for rt in under_tenant():
                store.delete_prefix(rt.prefix(loc.name))
        elif loc.rt is NAMESPACES:
            assert loc.tenant is not None
            if not store.exists(loc.key):
                raise self._missing(loc)
            for rt in namespaced():
                store.delete_prefix(rt.prefix(loc.tenant, loc.name))
        obj = store.delete(loc.key)
        if obj is None:
            raise self._missing(loc)
        if loc.rt is ALLOCATIONS:
            assert loc.tenant is not None
            baremetal.release(store, loc.tenant, obj)
        return obj

    def _release_allocations(self, rows: list[str], tenant: str) -> None:
        for raw in rows:
            baremetal.release(self.store, tenant, json.loads(raw))

    def _delete_collection(self, request: web.Request, loc: Loc) -> web.Response:
        if loc.rt in (TENANTS, NAMESPACES):
            raise StatusError(405, f"delete {loc.rt.plural} one at a time")
        if not loc.own_level:
            raise StatusError(
                405, f"deletecollection of {loc.rt.plural} needs the {loc.rt.scope} in the URL"
            )
        filters = self._filters(request, loc)
        page = self.store.scan(loc.prefix, owner=filters.owner, where=filters.clauses())
        with self.store.tx():
            for key in page.keys:
                name = key.rsplit("/", 1)[1]
                self._delete_one(Loc(loc.rt, loc.tenant, loc.namespace, name))
        return json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 200,
                "details": {"kind": loc.rt.plural, "deleted": len(page.keys)},
            }
        )

    # -- subresources -------------------------------------------------------------

    async def _subresource(
        self, request: web.Request, target: RequestTarget, loc: Loc
    ) -> web.StreamResponse:
        sub = target.subresource
        if loc.rt is SERVERS and sub == "tags":
            return await tags.handle(request, self.store, loc.key, loc.name, target.extra)
        if loc.rt is NODES and sub == "power" and not target.extra:
            return await baremetal.power(request, self.store, loc.name)
        if sub == "status" and not target.extra:
            return await self._status(request, loc)
        raise StatusError(404, f"{loc.rt.plural} have no subresource {sub!r}")

    async def _status(self, request: web.Request, loc: Loc) -> web.Response:
        """`…/{name}/status`: GET the object; PUT/PATCH change only its `status`."""
        current = self.store.get(loc.key)
        if current is None:
            raise self._missing(loc)
        if request.method in ("GET", "HEAD"):
            return json_response(current)
        if request.method not in ("PUT", "PATCH"):
            raise StatusError(405, f"{request.method} is not allowed on status")
        if request.method == "PATCH" and request.content_type == JSON_PATCH:
            patched = json_patch(current, await read_json(request))
            status = patched.get("status") if isinstance(patched, dict) else None
        else:
            body = await read_object(request)
            status = body.get("status")
            if request.method == "PATCH":
                status = merge_patch(current.get("status"), status)
        current["status"] = status
        self.store.write(loc.key, current, create=False)
        return json_response(current)


def make_app(db_path: str, assume_tenant: str | None = None) -> web.Application:
    """The backing store application over the SQLite file `db_path`.

    `assume_tenant`: the caller tenant of a short path without `X-Remote-Tenant` (for
    talking to the store directly, e.g. kubectl); None keeps such a request a 400."""
    store = Store(db_path)
    hub = Hub()
    store.listeners.append(hub.publish)
    service = Service(store, hub, assume_tenant)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STORE_KEY] = store
    app[HUB_KEY] = hub
    app.router.add_route("*", "/{tail:.*}", service.handle)

    async def on_shutdown(_app: web.Application) -> None:
        hub.close_all()

    async def on_cleanup(_app: web.Application) -> None:
        store.close()

    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


__all__ = ["HUB_KEY", "STORE_KEY", "Service", "make_app", "merge_patch", "read_json"]


def _without_field_selector(request: web.Request) -> str:
    return "&".join(
        part for part in request.query_string.split("&") if not part.startswith("fieldSelector=")
    )

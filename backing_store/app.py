"""The HTTP service of the reference backing store (DESIGN §10).

One catch-all aiohttp route: the URL is parsed with `sidecar.core.target.parse_target`
(the same grammar the sidecar uses), the resource type comes from `resources.py`, and
the verb picks a handler. Errors are Kubernetes Status bodies from `sidecar.core.status`;
a missing tenant answers exactly `tenant_not_found(t)`, the body the sidecar uses to
conceal other tenants. The service trusts `X-Remote-Tenant` (set by the sidecar) to
resolve short paths; `assume_tenant` (off by default) stands in for a missing header.

Kubernetes client compatibility (DESIGN §10) lives in its own modules: discovery
documents (`discovery.py`), selectors (`selectors.py`), `dryRun` (`dryrun.py`, run as a
rolled-back transaction), PATCH types (`patch.py`, `strategic.py`), server-side apply
and managedFields (`apply.py`), Table answers (`tables.py`), per-kind conversion
(`conversion.py`: Secret `stringData`) and bodies (`bodies.py`). Here: the store sets
`uid`, `creationTimestamp` and `resourceVersion` itself (a client's are ignored on
create and cannot change later), and an immediate DELETE answers a `Status`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from dataclasses import field as dc_field
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiohttp import web

from sidecar.core.target import (
    DEFAULT_TENANT,
    RESERVED_TENANTS,
    SYSTEM_TENANT,
    RequestTarget,
    Scope,
    TargetError,
    is_dns1123_label,
    parse_target,
)

from . import apply, baremetal, discovery, eviction, tags
from .bodies import (
    APPLY_PATCH,
    MAX_BODY_BYTES,
    check_media_type,
    json_response,
    raw_response,
    read_apply,
    read_body,
    read_json,
    read_object,
)
from .conversion import convert
from .dryrun import is_dry_run
from .errors import StatusError, bad_request, not_found, tenant_not_found
from .patch import JSON_PATCH, apply_patch, merge_patch
from .resources import (
    ALLOCATIONS,
    CLUSTER,
    NAMESPACE,
    NAMESPACES,
    NODES,
    PODS,
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
from .tables import TableFormat
from .watch import Hub, Render, event_line

log = logging.getLogger("backing_store")

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


def _modified(loc: Loc) -> StatusError:
    """The 409 of a write whose precondition (resourceVersion, uid) no longer holds."""
    return StatusError(
        409,
        f'Operation cannot be fulfilled on {loc.rt.plural} "{loc.name}": the object has '
        "been modified; please apply your changes to the latest version and try again",
        "Conflict",
    )


def _apply_preconditions(loc: Loc, current: Obj | None, meta: Any) -> None:
    """An apply's `metadata.resourceVersion` must be the stored object's (an apply that
    names one never creates: 409 when the object is missing), and its `metadata.uid`,
    when the object exists, the stored object's (when it is missing, the create sets
    its own uid as always): 409 Conflict otherwise, nothing stored."""
    if not isinstance(meta, dict):
        return
    want_rv, want_uid = meta.get("resourceVersion"), meta.get("uid")
    if want_rv not in (None, ""):
        if current is None or str(want_rv) != current["metadata"].get("resourceVersion"):
            raise _modified(loc)
    if want_uid not in (None, "") and current is not None:
        if str(want_uid) != current["metadata"].get("uid"):
            raise _modified(loc)


def _check_preconditions(loc: Loc, current: Obj, given: Any) -> None:
    """409 when `given` (a body's `metadata`, or DeleteOptions' `preconditions`) names
    another `resourceVersion` or `uid` than the stored object's."""
    if not isinstance(given, dict):
        return
    meta = current["metadata"]
    for field in ("resourceVersion", "uid"):
        want = given.get(field)
        if want not in (None, "") and str(want) != meta.get(field):
            raise _modified(loc)


async def _delete_preconditions(request: web.Request) -> dict[str, Any] | None:
    """The `preconditions` of a DELETE's DeleteOptions body (read and checked as an
    object already, by the dry-run check), or None."""
    raw = await read_body(request)
    if not raw.strip():
        return None
    options = await read_json(request)
    found = options.get("preconditions") if isinstance(options, dict) else None
    if found is not None and not isinstance(found, dict):
        raise bad_request("DeleteOptions.preconditions must be an object")
    return found


_PRECONDITION_PATHS = {"/metadata/resourceVersion": "resourceVersion", "/metadata/uid": "uid"}


def _json_patch_preconditions(loc: Loc, current: Obj, ops: Any) -> None:
    """409 when a `test` operation on `/metadata/resourceVersion` or `/metadata/uid`
    names another value than the stored object's (the patch is otherwise judged by
    `apply_patch`, which a malformed one fails with 400)."""
    if not isinstance(ops, list):
        return
    for op in ops:
        if not isinstance(op, dict) or op.get("op") != "test":
            continue
        path = op.get("path")
        field = _PRECONDITION_PATHS.get(path) if isinstance(path, str) else None
        if field is not None and "value" in op and op["value"] != current["metadata"].get(field):
            raise _modified(loc)


def _new_identity(obj: Obj) -> Obj:
    """A new object's `uid` and `creationTimestamp`: the store's own, whatever was sent."""
    meta = obj["metadata"]
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now()
    return obj


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
            obj = _new_identity(self._stamp(obj, TENANTS, None, None, name))
            self.store.write(TENANTS.key(None, None, name), obj, create=True)
            for ns in INITIAL_NAMESPACES:
                nobj: Obj = {"metadata": {"name": ns}}
                nobj = _new_identity(self._stamp(nobj, NAMESPACES, name, None, ns))
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
        target = read_target(request)
        if target.name_from_selector:
            # The sidecar names a list's target after its `fieldSelector` (for
            # resourceNames rules); the store addresses by path alone and applies
            # selectors itself.
            target = dataclasses.replace(target, name="")
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
            doc = discovery.document(path.strip("/").split("/"))
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
            return self._get(request, loc)
        if verb == "list":
            return self._list(request, loc)
        if verb == "watch":
            return await self._watch(request, loc)
        if verb == "create":
            return await self._create(request, loc)
        if verb in ("update", "patch"):
            return await self._update(request, loc, patch=verb == "patch")
        if verb == "delete":
            return self._delete(loc, await _delete_preconditions(request))
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

    def _get(self, request: web.Request, loc: Loc) -> web.Response:
        raw = self.store.get_raw(loc.key)
        if raw is None:
            raise self._missing(loc)
        table = TableFormat.of(request, loc.rt.plural)
        if table is not None:
            obj = json.loads(raw)
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return json_response(table.table([obj], meta))
        return raw_response(raw)

    def _filters(self, request: web.Request, loc: Loc) -> ListFilter:
        query = request.query
        filters = tags.parse_filters(query)
        if filters and loc.rt is not SERVERS:
            raise bad_request("tag filters apply to servers only")
        return ListFilter(query.get("owner") or None, filters, from_query(query, loc.rt.plural))

    def _list(self, request: web.Request, loc: Loc) -> web.Response:
        query = request.query
        limit: int | None = None
        if "limit" in query:
            text = query["limit"]
            if not text.isdigit() or int(text) <= 0:
                raise bad_request(f"limit must be a positive integer, not {text!r}")
            limit = int(text)
        filters = self._filters(request, loc)
        table = TableFormat.of(request, loc.rt.plural, across_tenants=_across_tenants(loc))
        prefix = loc.prefix
        after = decode_continue(query["continue"], prefix) if query.get("continue") else None
        page = self.store.scan(
            prefix, limit=limit, after=after, owner=filters.owner, where=filters.clauses()
        )
        meta: dict[str, Any] = {"resourceVersion": str(self.store.resource_version)}
        if page.more and page.last_key is not None:
            meta["continue"] = encode_continue(page.last_key)
        if table is not None:
            return json_response(table.table([json.loads(r) for r in page.rows], meta))
        head = dumps({"kind": loc.rt.list_kind, "apiVersion": loc.rt.api_version, "metadata": meta})
        return raw_response(head[:-1] + ',"items":[' + ",".join(page.rows) + "]}")

    async def _watch(self, request: web.Request, loc: Loc) -> web.StreamResponse:
        filters = self._filters(request, loc)
        table = TableFormat.of(request, loc.rt.plural, across_tenants=_across_tenants(loc))
        render: Render | None = None
        if table is not None:

            def render(event: str, obj: Obj) -> str:
                assert table is not None
                return event_line(event, table.table([obj], {}))

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
            if render is None:
                initial = ['{"type":"ADDED","object":' + raw + "}\n" for raw in page.rows]
            else:
                initial = [render("ADDED", json.loads(raw)) for raw in page.rows]
        return await self.hub.stream(request, wants, timeout, initial, render)

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
        manager = apply.field_manager(request, apply=False)
        obj = await read_object(request)
        name = self._check_body(obj, loc, name=None)
        apply.forget_client_fields(obj)
        convert(loc.rt.kind, obj)
        apply.record_update(None, obj, loc.rt.kind, manager, loc.rt.api_version, now())
        return self._insert(Loc(loc.rt, loc.tenant, loc.namespace, name), obj)

    def _insert(self, item: Loc, obj: Obj) -> web.Response:
        """Create `obj` (checked, converted, its managedFields set) at `item`: 201."""
        name = item.name
        new_tags = tags.validate_tags(obj["tags"]) if "tags" in obj else None
        if item.rt is SERVERS:
            obj["tags"] = new_tags or []
        if item.rt is TENANTS:
            if name in RESERVED_TENANTS:
                raise StatusError(
                    403, f"tenant {name!r} is reserved: it always exists and cannot be created"
                )
            if self.store.exists(item.key):
                raise StatusError(409, f'tenants "{name}" already exists', "AlreadyExists")
            obj = self._create_tenant(name, obj)
            return json_response(obj, status=201)
        self._require_namespace(item)
        if self.store.exists(item.key):
            raise StatusError(
                409,
                f'{item.rt.plural} "{name}" already exists',
                "AlreadyExists",
                details={"name": name, "kind": item.rt.plural},
            )
        obj = _new_identity(self._stamp(obj, item.rt, item.tenant, item.namespace, name))
        with self.store.tx():
            if item.rt is ALLOCATIONS:
                assert item.tenant is not None
                baremetal.allocate(self.store, item.tenant, obj)
            self.store.write(item.key, obj, create=True, tags=new_tags)
        return json_response(obj, status=201)

    async def _update(self, request: web.Request, loc: Loc, *, patch: bool) -> web.Response:
        if not loc.name:
            raise StatusError(405, f"{request.method} needs an item, not a collection")
        ctype = request.content_type
        if patch and ctype == APPLY_PATCH:
            return await self._apply(request, loc)
        if patch:
            apply.refuse_force(request)
        manager = apply.field_manager(request, apply=False)
        json_ops = patch and ctype == JSON_PATCH
        body: Any = await (read_json(request) if json_ops else read_object(request))
        current = self.store.get(loc.key)
        if current is None:
            raise self._missing(loc)
        if json_ops:
            # a JSON patch states its preconditions with `test` operations; one on the
            # resourceVersion or uid that fails is a conflict (409), as a stale version
            # in any other body is, rather than an unappliable patch (422)
            want_rv = None
            _json_patch_preconditions(loc, current, body)
            obj = apply_patch(ctype, current, body, loc.rt.kind)
            sets_tags = isinstance(obj, dict) and obj.get("tags") != current.get("tags")
        else:
            body_meta = body.get("metadata")
            want_rv = body_meta.get("resourceVersion") if isinstance(body_meta, dict) else None
            obj = apply_patch(ctype, current, body, loc.rt.kind) if patch else body
            sets_tags = "tags" in body
        if not isinstance(obj, dict):
            raise bad_request("the patched object is not a JSON object")
        self._check_body(obj, loc, name=loc.name)
        apply.forget_client_fields(obj)
        convert(loc.rt.kind, obj)
        return self._replace(loc, current, obj, want_rv, sets_tags, manager)

    async def _apply(self, request: web.Request, loc: Loc) -> web.Response:
        """Server-side apply (`apply.py`): creates a missing object (201)."""
        manager = apply.field_manager(request, apply=True)
        force = apply.force(request)
        body = await read_apply(request)
        rt = loc.rt
        if (body.get("apiVersion"), body.get("kind")) != (rt.api_version, rt.kind):
            raise bad_request(
                f"an apply body is the whole object: apiVersion {rt.api_version!r} and kind "
                f"{rt.kind!r}, not {body.get('apiVersion')!r} and {body.get('kind')!r}"
            )
        meta = body.get("metadata")
        if isinstance(meta, dict) and meta.get("managedFields") is not None:
            raise bad_request("metadata.managedFields must be nil in an apply body")
        self._check_body(body, loc, name=loc.name)
        current = self.store.get(loc.key)
        # The body's resourceVersion and uid are preconditions (issue 28): checked
        # before anything, so a stale apply is refused even when it would change
        # nothing, and an apply that names a version never creates.
        _apply_preconditions(loc, current, meta)
        obj = apply.apply(current, body, rt.kind, manager, rt.api_version, now(), force=force)
        convert(rt.kind, obj)
        if current is None:
            return self._insert(loc, obj)
        if obj == current:
            return json_response(current)  # nothing changed: nothing stored
        want_rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return self._replace(loc, current, obj, want_rv, "tags" in body, None)

    def _replace(
        self,
        loc: Loc,
        current: Obj,
        obj: Obj,
        want_rv: Any,
        sets_tags: bool,
        manager: str | None,
    ) -> web.Response:
        """Store `obj` (checked, converted) in place of `current`: 200. `manager` records
        an Update; None means `obj` carries its managedFields already (an apply)."""
        cur_meta = current["metadata"]
        if want_rv not in (None, "") and str(want_rv) != cur_meta["resourceVersion"]:
            raise _modified(loc)
        new_tags: list[str] | None = None
        if loc.rt is SERVERS:
            if sets_tags:
                new_tags = tags.validate_tags(obj.get("tags") or [])
                obj["tags"] = new_tags
            else:
                obj["tags"] = current.get("tags") or []
        meta = obj["metadata"]
        for field in ("uid", "creationTimestamp"):  # set on create, never changed
            if field in cur_meta:
                meta[field] = cur_meta[field]
            else:
                meta.pop(field, None)
        obj = self._stamp(obj, loc.rt, loc.tenant, loc.namespace, loc.name)
        if manager is not None:
            apply.record_update(current, obj, loc.rt.kind, manager, loc.rt.api_version, now())
        self.store.write(loc.key, obj, create=False, tags=new_tags)
        return json_response(obj)

    def _delete(self, loc: Loc, preconditions: dict[str, Any] | None = None) -> web.Response:
        """An immediate delete answers a success `Status`, as Kubernetes does. The
        DeleteOptions' `preconditions` (`resourceVersion`, `uid`) must hold: 409."""
        if loc.rt is TENANTS and loc.name in RESERVED_TENANTS:
            raise StatusError(
                403, f"tenant {loc.name!r} is reserved: it always exists and cannot be deleted"
            )
        with self.store.tx():
            if preconditions:
                current = self.store.get(loc.key)
                if current is None:
                    raise self._missing(loc)
                _check_preconditions(loc, current, preconditions)
            obj = self._delete_one(loc)
        details: dict[str, Any] = {"name": loc.name}
        if loc.rt.group:
            details["group"] = loc.rt.group
        details["kind"] = loc.rt.plural
        uid = (obj.get("metadata") or {}).get("uid")
        if uid:
            details["uid"] = uid
        return json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }
        )

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
        if loc.rt is PODS and sub == "eviction" and not target.extra:
            return await eviction.evict(request, loc.name, lambda: self._delete(loc))
        # Details without a name, as the API server's 404 for a path it does not serve:
        # clients tell "no such subresource" from "no such object" by that (kubectl
        # debug reads `details.name` and panics on a Status without details).
        raise StatusError(
            404,
            f"{loc.rt.plural} have no subresource {sub!r}",
            details={"group": target.api_group, "kind": loc.rt.plural},
        )

    async def _status(self, request: web.Request, loc: Loc) -> web.Response:
        """`…/{name}/status`: GET the object; PUT/PATCH change only its `status`."""
        current = self.store.get(loc.key)
        if current is None:
            raise self._missing(loc)
        if request.method in ("GET", "HEAD"):
            return json_response(current)
        if request.method not in ("PUT", "PATCH"):
            raise StatusError(405, f"{request.method} is not allowed on status")
        ctype = request.content_type
        if request.method == "PATCH" and ctype == APPLY_PATCH:
            raise StatusError(
                415,
                "server-side apply is served on objects, not on their status subresource: "
                "patch the status with JSON (a merge, strategic merge or JSON patch)",
            )
        manager = apply.field_manager(request, apply=False)
        if request.method == "PATCH":
            body: Any = await (read_json(request) if ctype == JSON_PATCH else read_object(request))
            if ctype == JSON_PATCH:
                _json_patch_preconditions(loc, current, body)
            else:
                _check_preconditions(loc, current, body.get("metadata"))
            patched = apply_patch(ctype, current, body, loc.rt.kind)
            status = patched.get("status") if isinstance(patched, dict) else None
        else:
            whole = await read_object(request)
            _check_preconditions(loc, current, whole.get("metadata"))
            status = whole.get("status")
        new = copy.deepcopy(current)
        new["status"] = status
        kind, version = loc.rt.kind, loc.rt.api_version
        apply.record_update(current, new, kind, manager, version, now(), subresource="status")
        self.store.write(loc.key, new, create=False)
        return json_response(new)


# Request lines, header fields and header counts the store accepts: above what the
# sidecar forwards with its default limits (a 64 KiB target, re-encoded; header fields
# up to `limits.maxHeaderBytes`, 32 KiB; a client's 128 headers plus one X-Remote-Group
# per group of a 16 KiB token), so nothing the sidecar accepted is refused here for its
# size. aiohttp's defaults (8190 bytes) refused 8-16 KiB JWTs, quoting the token.
MAX_LINE_BYTES = 256 * 1024
MAX_FIELD_BYTES = 64 * 1024
MAX_HEADERS = 8192


def make_app(db_path: str, assume_tenant: str | None = None) -> web.Application:
    """The backing store application over the SQLite file `db_path`.

    `assume_tenant`: the caller tenant of a short path without `X-Remote-Tenant` (for
    talking to the store directly, e.g. kubectl); None keeps such a request a 400."""
    store = Store(db_path)
    hub = Hub()
    store.listeners.append(hub.publish)
    service = Service(store, hub, assume_tenant)
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        handler_args={
            "max_line_size": MAX_LINE_BYTES,
            "max_field_size": MAX_FIELD_BYTES,
            "max_headers": MAX_HEADERS,
        },
    )
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


__all__ = ["HUB_KEY", "STORE_KEY", "Service", "make_app", "merge_patch", "read_json", "read_target"]


def _across_tenants(loc: Loc) -> bool:
    """A collection of a type stored under tenants, read across every tenant."""
    return loc.tenant is None and loc.rt.scope != CLUSTER and not loc.name


def read_target(request: web.BaseRequest) -> RequestTarget:
    """The store's reading of a request target: the path by the URL grammar it shares
    with the sidecar, the query exactly as aiohttp decodes it (`request.query`), which
    is what every handler here reads its parameters from."""
    return parse_target(request.method, request.raw_path, query_pairs=list(request.query.items()))

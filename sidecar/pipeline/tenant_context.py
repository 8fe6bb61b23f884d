"""Tenant contexts (DESIGN §3 "Tenant contexts"): a server URL ending in `/tenants/{t}`.

Stock kubectl cannot name a tenant, so an operator's kubeconfig may point a context at
`https://sidecar/tenants/acme`: kubectl then sends `/tenants/acme/api/v1/namespaces/dev/
configmaps`, `/tenants/acme/apis`, `/tenants/acme/version`, … This module is the pure
part of reading such a request:

- `split_context(raw_path)`: the context tenant and the rest of the target (still
  percent-encoded, the query kept), or None when the path is no context. The prefix is
  read like any path (`core/target.py`: decoded once, a `%2F` never a separator); a
  malformed one (`/tenants`, `/tenants/`, `/tenants//api`, a tenant that is not a
  DNS-1123 label, a `.`/`..` segment) is a `TargetError` (400), and nothing is forwarded.
- `in_context(target, t)`: the parsed rest as the same request in tenant `t`: every short
  path in `t` (`namespaces/dev/…` → `tenants/t/namespaces/dev/…`, the access reviews
  included), a cluster-level list or watch of a resource stored under tenants
  (`/api/v1/configmaps`) as `t`'s (`/api/v1/tenants/t/configmaps`); cluster-scoped
  objects (nodes, the Tenant objects) and non-resource URLs (discovery) unchanged. A
  path that names another tenant's objects is a 400: a context means one tenant.

Who may use a context (a member of `t` or a `system` operator, and `t` must exist) is
`TenantContextStage`'s, below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from cachetools import TTLCache
from yarl import URL

from sidecar.core.status import StatusError, forbidden, tenant_not_found
from sidecar.core.target import (
    RESERVED_TENANTS,
    RequestTarget,
    Scope,
    TargetError,
    decode_segment,
    is_dns1123_label,
)
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.policy.scopes import TENANT_OBJECTS, is_cluster_scoped

__all__ = [
    "CONTEXT_KEY",
    "Context",
    "TenantContextStage",
    "contextual",
    "enter",
    "in_context",
    "split_context",
]


@dataclass(frozen=True, slots=True)
class Context:
    """A request addressed through a tenant context."""

    tenant: str
    # The rest of the request target after `/tenants/{t}` ("/" when nothing follows),
    # percent-encoded as sent, with its query.
    rest: str


def split_context(raw_target: str) -> Context | None:
    """The tenant context of a request target (path and query as sent), or None when
    its first path segment is not `tenants`. Raises `TargetError` (400) for a malformed
    prefix."""
    path, sep, query = raw_target.partition("?")
    if not path.startswith("/"):
        return None
    first, slash, after = path[1:].partition("/")
    if _decoded(first) != "tenants":
        return None
    raw_tenant, slash2, tail = after.partition("/")
    if not slash or not raw_tenant:
        raise TargetError(
            "a tenant context is /tenants/{tenant} followed by the API path "
            "(e.g. /tenants/acme/api/v1/namespaces/dev/configmaps); the tenant is missing"
        )
    tenant = _decoded(raw_tenant)
    if not is_dns1123_label(tenant):
        raise TargetError(
            f"the tenant context {tenant[:63]!r} is not a tenant name "
            "(a DNS-1123 label: lower-case letters, digits and '-', at most 63 characters)"
        )
    rest = "/" + tail if slash2 else "/"
    if slash2 and (not tail or tail.startswith("/")):
        raise TargetError("the path has an empty segment ('//' or a trailing '/')")
    if tail and _decoded(tail.partition("/")[0]) == "tenants":
        # `/tenants/beta/tenants/acme/…`: one context names one tenant; the rest would
        # otherwise be a non-resource URL naming another.
        raise TargetError("a tenant context names one tenant: /tenants/{t} appears twice")
    return Context(tenant, rest + sep + query)


def _decoded(segment: str) -> str:
    """One path segment decoded as the target parser decodes it (400 for bad escapes,
    non-UTF-8, control characters, `.` and `..`)."""
    text = decode_segment(segment)
    if text in (".", ".."):
        raise TargetError("the path has a '.' or '..' segment")
    return text


def in_context(target: RequestTarget, tenant: str) -> RequestTarget:
    """The request `target` (parsed from the rest of the path) in tenant context
    `tenant`. Raises `TargetError` (400) for a path naming another tenant's objects."""
    if not target.resource_request:
        return target
    if target.short_path and target.tenant is None:
        encoded = target.encoded
        if encoded or target.encoded_tail:
            encoded = f"{encoded}/tenants/{tenant}{target.encoded_tail}"
        return dataclasses.replace(target, tenant=tenant, encoded=encoded, encoded_tail="")
    if target.scope != Scope.CLUSTER:
        if target.tenant != tenant:
            raise TargetError(
                f"the tenant context is {tenant!r} but the path names tenant "
                f"{target.tenant!r}: use that tenant's context, or no context"
            )
        return target
    if (
        target.tenant is None
        and target.verb in ("list", "watch", "deletecollection")
        and (target.name_from_selector or not target.name)
        and not target.subresource
        and not is_cluster_scoped(target.api_group, target.resource)
        and (target.api_group, target.resource) not in TENANT_OBJECTS
    ):
        # `kubectl get cm -A` in a context: every namespace of that tenant.
        return target.within_tenant(tenant)
    return target


# -- the request side: dispatch, parse, and who may use a context --------------------

CONTEXT_KEY: web.RequestKey[Context] = web.RequestKey("sidecar.tenant-context", Context)
ERROR_KEY: web.RequestKey[TargetError] = web.RequestKey("sidecar.tenant-context-error", TargetError)
# How long a tenant the upstream said exists is remembered (a system caller's context).
EXISTS_TTL_SECONDS = 5.0

TenantExists = Callable[[str], Awaitable[bool]]


def enter(request: web.Request) -> web.Request:
    """For the dispatch by path (app.py): a request through a tenant context becomes the
    request of the rest of its target (routed, parsed and forwarded as that), with the
    context kept in the request's state. A malformed prefix is kept as it came, with
    the error in its state: the parse stage answers it (400), after the metrics and
    audit stages saw it, and nothing is forwarded."""
    try:
        found = split_context(request.raw_path)
    except TargetError as exc:
        request[ERROR_KEY] = exc
        return request
    if found is None:
        return request
    path, _, query = found.rest.partition("?")
    try:
        clone = request.clone(rel_url=URL.build(path=path, query_string=query, encoded=True))
    except (ValueError, RuntimeError):
        request[ERROR_KEY] = TargetError("the request target cannot be read")
        return request
    clone[CONTEXT_KEY] = found
    return clone


def contextual(request: web.BaseRequest, target: RequestTarget) -> RequestTarget:
    """For the parse stage: the parsed target in the request's tenant context, if any.
    Raises `StatusError` 400 for a malformed context or a path naming another tenant."""
    error = request.get(ERROR_KEY)
    if error is not None:
        raise StatusError(error.code, error.message)
    found = request.get(CONTEXT_KEY)
    if found is None:
        return target
    try:
        return in_context(target, found.tenant)
    except TargetError as exc:
        raise StatusError(exc.code, exc.message) from None


class TenantContextStage:
    """Who may use a tenant context (DESIGN §3): a user of that tenant, or a `system`
    operator when the tenant exists. Anyone else gets the 404 of a tenant that does not
    exist (403 with `concealOtherTenants: false`), before anything is decided, charged
    or forwarded. Runs after authentication and the tenant rate limit (the caller pays
    for its refusals) and before impersonation: the caller who sends the request is
    the one who must belong to the context's tenant."""

    name = "tenant-context"

    def __init__(self, exists: TenantExists, *, conceal: bool = True) -> None:
        self._exists = exists
        self._conceal = conceal
        self._known: TTLCache[str, bool] = TTLCache(maxsize=4096, ttl=EXISTS_TTL_SECONDS)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        found = ctx.request.get(CONTEXT_KEY)
        if found is None:
            return await call_next(ctx)
        caller = ctx.authenticated().sender
        tenant = found.tenant
        ctx.audit["tenantContext"] = tenant
        if caller.tenant != tenant:
            if not caller.is_operator:
                if self._conceal:
                    raise tenant_not_found(tenant)
                raise forbidden(
                    f'user "{caller.user}" of tenant "{caller.tenant}" cannot use the '
                    f'context of tenant "{tenant}"'
                )
            if not await self._tenant_exists(tenant):
                raise tenant_not_found(tenant)
        return await call_next(ctx)

    async def _tenant_exists(self, tenant: str) -> bool:
        if tenant in RESERVED_TENANTS or self._known.get(tenant):
            return True
        if not await self._exists(tenant):
            return False
        self._known[tenant] = True
        return True

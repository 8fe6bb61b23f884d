"""The quota API (`/quota/v1/…`, DESIGN §7), answered by the sidecar itself.

Routes (Magnum's names): `GET defaults`, `GET quotas` (list), `GET tenants/{t}` (show),
`GET tenants/{t}/usage`, `PUT tenants/{t}/{resource}` `{"hard_limit": N}` (update), and
the same three under `tenants/{t}/namespaces/{ns}`.

Authorization: the defaults are readable by every authenticated caller. Everything
else is decided by the one decision function (`policy/decide.py`) as the
cluster-scoped resource `quotas` of API group `quota.sidecar` named by the tenant
(verbs list, get, update; reading one's own tenant's quota and usage is a built-in
grant). A call naming another tenant without the grant is that tenant's 404 (tenants
cannot see each other); listing, or updating one's own tenant's quota, without it is
403. An update for a tenant that does
not exist is a 404: a tenant exists when it is reserved (system, default), or the
backing store answers 200 to `GET /api/v1/tenants/{t}`.

`QuotaService` holds the operations themselves; the CLI uses it too.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sidecar.core.quantities import exact_units, format_units
from sidecar.core.status import StatusError, bad_request, not_found, tenant_not_found
from sidecar.core.target import (
    RESERVED_TENANTS,
    RequestTarget,
    Scope,
    is_dns1123_label,
)
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.quota import ledger_unavailable
from sidecar.policy.decide import decide
from sidecar.policy.engine import DecisionCache
from sidecar.policy.isolation import QUOTA_GROUP
from sidecar.policy.kinds.quotas import QuotaPolicy, effective_limits, limit_error
from sidecar.services.audit import authz_record
from sidecar.services.quota.ledger import TENANT_SCOPE, Ledger, LedgerError, Usage

if TYPE_CHECKING:
    from sidecar.edge.proxy import Upstream

PREFIX = "/quota/v1"
# tenant → True/False (exists), or raises StatusError when it cannot be told.
TenantCheck = Callable[[str], Awaitable[bool]]


class QuotaService:
    def __init__(
        self, ledger: Ledger, policy: Callable[[], QuotaPolicy], tenant_exists: TenantCheck
    ) -> None:
        self.ledger = ledger
        self.policy = policy
        self.tenant_exists = tenant_exists

    async def _usage(self, tenant: str) -> Usage:
        try:
            return await self.ledger.usage(tenant)
        except LedgerError as exc:
            raise ledger_unavailable(exc, "quota api", "quota calls fail") from None

    def defaults(self) -> dict[str, Any]:
        hard = self.policy().defaults
        return {"hard": {r: format_units(r, n) for r, n in sorted(hard.items())}}

    async def show(self, tenant: str, namespace: str = "") -> dict[str, Any]:
        usage = await self._usage(tenant)
        pol = self.policy()
        if namespace:
            file_limits = pol.namespace_limits(tenant, namespace)
            file_source = pol.namespace_sources(tenant, namespace)
        else:
            file_limits, file_source = pol.tenant_limits(tenant)
        scope = namespace or TENANT_SCOPE
        hard, source = effective_limits(file_limits, file_source, usage.limits.get(scope, {}))
        names = sorted(
            set(hard) | set(usage.used.get(scope, {})) | set(usage.in_progress.get(scope, {}))
        )
        rows = []
        for res in names:
            used = usage.get_used(scope, res)
            inprog = usage.get_in_progress(scope, res)
            limit = hard.get(res)
            available = None if limit is None else limit - used - inprog
            rows.append(
                {
                    "resource": res,
                    "hard_limit": None if limit is None else format_units(res, limit),
                    "used": format_units(res, used),
                    "in_progress": format_units(res, inprog),
                    "available": None
                    if available is None
                    else format_units(res, max(available, 0)),
                    "overage": 0 if available is None else format_units(res, max(-available, 0)),
                    "source": source.get(res, "none"),
                }
            )
        return {"tenant": tenant, "namespace": namespace or None, "quotas": rows}

    async def usage(self, tenant: str, namespace: str = "") -> dict[str, Any]:
        usage = await self._usage(tenant)

        def scope_view(scope: str) -> dict[str, Any]:
            names = sorted(set(usage.used.get(scope, {})) | set(usage.in_progress.get(scope, {})))
            return {
                r: {
                    "used": format_units(r, usage.get_used(scope, r)),
                    "in_progress": format_units(r, usage.get_in_progress(scope, r)),
                }
                for r in names
            }

        out: dict[str, Any] = {"tenant": tenant, "namespace": namespace or None}
        if namespace:
            out["usage"] = scope_view(namespace)
        else:
            out["usage"] = scope_view(TENANT_SCOPE)
            out["namespaces"] = {
                ns: scope_view(ns) for ns in sorted(set(usage.used) | set(usage.in_progress)) if ns
            }
        return out

    async def list(self) -> dict[str, Any]:
        pol = self.policy()
        try:
            known = set(await self.ledger.tenants())
        except LedgerError as exc:
            raise ledger_unavailable(exc, "quota api", "quota calls fail") from None
        tenants = sorted(known | set(pol.tenants) | {t for t, _ in pol.namespaces})
        return {"items": [await self.show(t) for t in tenants]}

    async def update(self, tenant: str, namespace: str, resource: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or "hard_limit" not in body:
            raise bad_request('the body must be {"hard_limit": N} (null removes the API limit)')
        extra = set(body) - {"hard_limit"}
        if extra:
            raise bad_request(f"unknown field(s): {', '.join(sorted(extra))}")
        value = body["hard_limit"]
        hard: int | None = None
        if value is not None:
            error = limit_error(resource, value)
            if error:
                raise bad_request(error)
            hard = exact_units(resource, value)
        if not await self.tenant_exists(tenant):
            raise tenant_not_found(tenant)
        try:
            await self.ledger.set_limit(tenant, namespace, resource, hard)
        except LedgerError as exc:
            raise ledger_unavailable(exc, "quota api", "quota calls fail") from None
        return await self.show(tenant, namespace)


def upstream_tenant_check(upstream: Upstream) -> TenantCheck:
    async def exists(tenant: str) -> bool:
        if tenant in RESERVED_TENANTS:
            return True
        from sidecar.services.quota.reconcile import RECONCILER

        status, _ = await upstream.get_json(f"/api/v1/tenants/{tenant}", RECONCILER)
        if status == 200:
            return True
        if status == 404:
            return False
        raise StatusError(
            503, f"cannot tell whether tenant {tenant} exists: the backing store answered {status}"
        )

    return exists


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, indent=None))


def quota_target(verb: str, tenant: str = "") -> RequestTarget:
    """A quota API call as the request the policy decides (`policy test` cases write it
    as `/apis/quota.sidecar/v1/quotas[/TENANT]`)."""
    path = f"/apis/{QUOTA_GROUP}/v1/quotas" + (f"/{tenant}" if tenant else "")
    return RequestTarget(
        path=path,
        verb=verb,
        resource_request=True,
        api_group=QUOTA_GROUP,
        api_version="v1",
        scope=Scope.CLUSTER,
        tenant=tenant or None,
        resource="quotas",
        name=tenant,
    )


class QuotaApi:
    def __init__(
        self,
        service: QuotaService,
        *,
        conceal: bool = True,
        cache: DecisionCache | None = None,
    ) -> None:
        self.service = service
        self.conceal = conceal
        self.cache = cache

    def _authorize(self, ctx: RequestContext, verb: str, tenant: str = "") -> None:
        """Decide with the one decision function: the call is the cluster-scoped
        resource `quotas` of API group `quota.sidecar`, named by the tenant (so reading
        another tenant's quota without the grant is that tenant's 404, and reading
        one's own is a built-in grant). Always enforced: dry-run never opens it."""
        v = decide(
            ctx.policy,
            ctx.authenticated(),
            quota_target(verb, tenant),
            conceal=self.conceal,
            cache=self.cache,
        )
        ctx.decision = v
        ctx.audit["authz"] = authz_record(v)
        if not v.allowed:
            raise v.refusal()

    async def __call__(self, ctx: RequestContext) -> web.StreamResponse:
        ctx.authenticated()  # the 401 when no stage set an identity
        path = ctx.request.path
        rest = path[len(PREFIX) :].strip("/")
        parts = rest.split("/") if rest else []
        method = ctx.request.method
        if parts == ["defaults"]:
            _method(method, "GET")
            return _json(self.service.defaults())
        if parts == ["quotas"]:
            _method(method, "GET")
            self._authorize(ctx, "list")
            return _json(await self.service.list())
        if len(parts) >= 2 and parts[0] == "tenants":
            tenant = parts[1]
            tail = parts[2:]
            namespace = ""
            if len(tail) >= 2 and tail[0] == "namespaces":
                namespace = tail[1]
                tail = tail[2:]
                if not is_dns1123_label(namespace):
                    raise bad_request(f"invalid namespace name {namespace!r}")
            if not is_dns1123_label(tenant):
                raise bad_request(f"invalid tenant name {tenant!r}")
            if not tail or tail == ["usage"]:
                _method(method, "GET")
                self._authorize(ctx, "get", tenant)
                if tail:
                    return _json(await self.service.usage(tenant, namespace))
                return _json(await self.service.show(tenant, namespace))
            if len(tail) == 1:
                _method(method, "PUT")
                self._authorize(ctx, "update", tenant)
                body = await _read_json(ctx)
                return _json(await self.service.update(tenant, namespace, tail[0], body))
        raise not_found("quota path", path)


def _method(method: str, allowed: str) -> None:
    if method != allowed and not (allowed == "GET" and method == "HEAD"):
        raise StatusError(
            405, f"method {method} is not allowed here (use {allowed})", headers={"Allow": allowed}
        )


async def _read_json(ctx: RequestContext) -> Any:
    return await ctx.read_json()

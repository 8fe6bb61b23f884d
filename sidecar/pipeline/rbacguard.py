"""Guarded writes of policy objects (DESIGN §5 "Policy objects through the API").

A create, update or patch of a Role, RoleBinding, TenantRole, TenantRoleBinding or
namespace ResourceQuota is judged on the object the upstream says it would store (its
answer to the same request as a dry run, so every patch type is judged as applied),
before the request is forwarded:

- validated with the policy files' rules (`sidecar/policy/source/api.py`): unknown
  verbs and fields, malformed rules, subjects of another tenant, a roleRef of the
  wrong scope, quota resources and quantities → 422 Invalid, each cause naming its
  field; nothing is stored;
- guarded against escalation as Kubernetes does (`sidecar/policy/escalation.py`) → 403
  naming the first rule not held.

Runs after authorization (the caller may write the object at all) and in every mode.
A dry run the upstream refuses is not judged here: the real request gets the same
refusal from the upstream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from sidecar.core.status import StatusError
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.policy.escalation import binding_write_refusal, role_write_refusal
from sidecar.policy.source.api import Cause, check_object, kind_of
from sidecar.upstream.client import DryRunAnswer

WRITE_VERBS = frozenset({"create", "update", "patch"})

DryRun = Callable[[RequestContext], Awaitable[DryRunAnswer]]


def invalid(
    kind: str, resource: str, group: str, name: str, causes: tuple[Cause, ...]
) -> StatusError:
    first_field, first_message = causes[0]
    where = f"{first_field}: " if first_field else ""
    return StatusError(
        422,
        f'{kind} "{name}" is invalid: {where}{first_message}',
        "Invalid",
        details={
            "name": name,
            "group": group,
            "kind": resource,
            "causes": [
                {"reason": "FieldValueInvalid", "message": message, "field": field}
                for field, message in causes
            ],
        },
    )


class RbacGuardStage:
    name = "rbacguard"

    def __init__(self, dry_run: DryRun) -> None:
        self.dry_run = dry_run

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        target = ctx.target
        if (
            target is None
            or not target.resource_request
            or target.verb not in WRITE_VERBS
            or target.subresource
        ):
            return await call_next(ctx)
        kind = kind_of(target.api_group, target.resource)
        if kind is None:
            return await call_next(ctx)
        decided = ctx.decision.target if ctx.decision is not None else None
        decided = decided or target
        identity = ctx.authenticated()
        tenant = decided.tenant or identity.tenant
        namespace = decided.namespace or ""
        answer = await self.dry_run(ctx)
        if not 200 <= answer.status < 300 or not isinstance(answer.object, dict):
            return await call_next(ctx)
        checked = check_object(kind, answer.object, tenant, namespace)
        meta = answer.object.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        name = name if isinstance(name, str) else target.name
        if checked.problems:
            raise invalid(kind, target.resource, target.api_group, name, checked.problems)
        engine = ctx.policy.engine
        refusal = None
        if checked.role is not None:
            refusal = role_write_refusal(engine, identity, checked.role)
        elif checked.binding is not None:
            refusal = binding_write_refusal(engine, identity, checked.binding)
        if refusal is not None:
            raise StatusError(
                403,
                f'{target.resource}.{target.api_group} "{name}" is forbidden: {refusal}',
                "Forbidden",
                details={"name": name, "group": target.api_group, "kind": target.resource},
            )
        return await call_next(ctx)

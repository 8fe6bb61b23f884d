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
  naming the first rule not held;
- bounded in size: a stored form above `MAX_OBJECT_BYTES` → 413 (every replica follows
  these objects through one watch per kind, so one huge object, grown a patch at a
  time, would slow everyone's grants and revocations);
- written whole only: a write to a subresource of one of these objects (`…/status`)
  → 405. RBAC kinds have none in Kubernetes, and a quota's status is the sidecar's to
  say; a subresource write would otherwise change the object unjudged.

Runs after authorization (the caller may write the object at all) and in every mode.
A dry run the upstream refuses is answered as refused (its status and body), and the
real request is not sent: nothing is ever forwarded unjudged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import yaml
from aiohttp import web

from sidecar.core.status import StatusError
from sidecar.core.target import RequestTarget
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.policy.escalation import binding_write_refusal, role_write_refusal
from sidecar.policy.source.api import Cause, check_object, kind_of
from sidecar.upstream.client import DryRunAnswer

WRITE_VERBS = frozenset({"create", "update", "patch"})
READ_VERBS = frozenset({"get", "list", "watch"})
# As Kubernetes bounds one object by etcd's request size (1.5 MiB); well under the
# follower's bound on one watch event (`services/apipolicy.py` MAX_EVENT_BYTES).
MAX_OBJECT_BYTES = 1024 * 1024
# Cluster-wide RBAC comes from the policy files only (docs/policy.md).
NOT_FOLLOWED = frozenset(
    {
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"),
    }
)
NOT_FOLLOWED_WARNING = (
    '299 - "ClusterRoles and ClusterRoleBindings written through the API are stored but '
    'not in force: cluster-wide grants come from the policy files"'
)

DryRun = Callable[[RequestContext], Awaitable[DryRunAnswer]]
# `Upstream.get_json`: (path, identity) → (status, JSON).
GetJson = Callable[..., Awaitable[tuple[int, Any]]]


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

    def __init__(self, dry_run: DryRun, get_json: GetJson | None = None) -> None:
        self.dry_run = dry_run
        self.get_json = get_json

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        target = ctx.target
        if target is None or not target.resource_request or target.verb in READ_VERBS:
            return await call_next(ctx)
        kind = kind_of(target.api_group, target.resource)
        if target.subresource:
            if kind is not None:
                raise StatusError(
                    405,
                    f"{target.resource}.{target.api_group or 'core'} have no writable "
                    f"subresource {target.subresource!r}: write the object itself",
                    "MethodNotAllowed",
                )
            return await call_next(ctx)
        if target.verb not in WRITE_VERBS:
            return await call_next(ctx)
        if kind is None:
            if (target.api_group, target.resource) in NOT_FOLLOWED:
                # Stored, never in force: say so rather than succeed silently.
                ctx.response_headers["Warning"] = NOT_FOLLOWED_WARNING
            return await call_next(ctx)
        decided = ctx.decision.target if ctx.decision is not None else None
        decided = decided or target
        identity = ctx.authenticated()
        tenant = decided.tenant or identity.tenant
        namespace = decided.namespace or ""
        answer = await self.dry_run(ctx)
        if not 200 <= answer.status < 300:
            # Never forwarded unjudged: a refusal of the dry run could turn into a
            # success by the time the real request lands (a precondition another write
            # makes true). The client gets the dry run's answer and may retry.
            return web.Response(
                status=answer.status,
                body=answer.body,
                headers={"Content-Type": answer.content_type or "application/json"},
            )
        if not isinstance(answer.object, dict):
            raise StatusError(502, "the upstream's dry run did not answer an object")
        if len(answer.body) > MAX_OBJECT_BYTES:
            raise StatusError(
                413,
                f"{target.resource}.{target.api_group or 'core'} would be stored with "
                f"{len(answer.body)} bytes; a policy object may have at most "
                f"{MAX_OBJECT_BYTES}",
                "RequestEntityTooLarge",
            )
        checked = check_object(kind, answer.object, tenant, namespace)
        meta = answer.object.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        name = name if isinstance(name, str) else target.name
        if checked.problems:
            raise invalid(kind, target.resource, target.api_group, name, checked.problems)
        if checked.binding is not None and target.verb != "create":
            await self._role_ref_unchanged(ctx, decided, kind, name, answer.object)
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
        if target.verb == "patch":
            pin_patch(ctx, answer.object)
        return await call_next(ctx)

    async def _role_ref_unchanged(
        self,
        ctx: RequestContext,
        target: RequestTarget,
        kind: str,
        name: str,
        new: dict[str, Any],
    ) -> None:
        """A binding's roleRef is immutable (as in Kubernetes): delete and recreate."""
        if self.get_json is None or not target.name:
            return
        parts = [(target.api_group and f"apis/{target.api_group}") or "api", target.api_version]
        parts += ["tenants", target.tenant or ""]
        if target.namespace:
            parts += ["namespaces", target.namespace]
        parts += [target.resource, target.name]
        path = "/" + "/".join(quote(p, safe="") if i > 0 else p for i, p in enumerate(parts))
        status, current = await self.get_json(path, ctx.identity, [], ctx.request_id)
        if status != 200 or not isinstance(current, dict):
            return
        before, after = current.get("roleRef"), new.get("roleRef")
        if not isinstance(before, dict) or not isinstance(after, dict):
            return
        if (before.get("kind"), before.get("name")) != (after.get("kind"), after.get("name")):
            raise invalid(
                kind,
                target.resource,
                target.api_group,
                name,
                (("roleRef", "roleRef is immutable: delete the binding and create it again"),),
            )


def pin_patch(ctx: RequestContext, judged: dict[str, Any]) -> None:
    """Make a patch apply to the version it was judged on, or fail with 409.

    A patch's result depends on the object it lands on: judged on the dry run's object,
    it could land on one changed in between (another writer adding a rule) and make
    what was never judged. So the forwarded patch states the judged version as its
    precondition, as a client would (`test` op of a JSON patch, `metadata.
    resourceVersion` in a merge, strategic or apply patch); the store refuses it
    (409 Conflict, the client retries) when the object changed."""
    meta = judged.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if not isinstance(rv, str) or not rv:
        return  # an apply that creates: nothing to pin
    request = ctx.request
    if request.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        raise StatusError(415, "a patch of a policy object may not have a Content-Encoding")
    ctype = request.content_type
    raw = ctx.body or b""
    try:
        if ctype == "application/apply-patch+yaml":
            body: Any = yaml.safe_load(raw.decode("utf-8")) if raw else None
        else:
            body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError, yaml.YAMLError):
        raise StatusError(400, "the patch body cannot be read") from None
    if ctype == "application/json-patch+json":
        if not isinstance(body, list):
            raise StatusError(400, "a JSON patch must be a list of operations")
        test = {"op": "test", "path": "/metadata/resourceVersion", "value": rv}
        pinned: Any = [test, *body]
    else:
        if not isinstance(body, dict):
            raise StatusError(400, "the patch body must be a JSON object")
        body_meta = body.get("metadata")
        if body_meta is None:
            body_meta = {}
        if not isinstance(body_meta, dict):
            raise StatusError(400, "metadata must be a JSON object")
        pinned = {**body, "metadata": {**body_meta, "resourceVersion": rv}}
    ctx.body = json.dumps(pinned).encode()
    ctx.parsed_body = pinned

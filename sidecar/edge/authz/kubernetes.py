"""The Kubernetes authorization webhook (`POST /kubernetes`, DESIGN §13).

A `SubjectAccessReview` of `authorization.k8s.io/v1` (groups in `spec.groups`) or
`v1beta1` (`spec.group`), answered in the same version with `status.allowed` as the
one decision function decides the request it describes (`reviews.review_target`, the
owner read with the subject's identity). The user's tenant is `spec.extra.tenant[0]`;
the resource's tenant is `resourceAttributes.tenant` (Arktos) when given, else the
user's. `status.denied: true` only for refusals no other authorizer may override (the
target is outside the user's tenant: isolation); any other refusal is "no opinion"
(`allowed: false`, `denied: false`) with a `reason`, so Kubernetes RBAC may still
allow. A review without a user tenant gets "no opinion". The API server has
authenticated the user and is the only client of this endpoint: no credentials and no
rate limit apply; every review is counted and audited as the subject's.

Malformed review → 400 Status, never an allow.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from sidecar.core.identity import Identity, printable
from sidecar.core.status import StatusError, bad_request
from sidecar.core.target import is_dns1123_label
from sidecar.edge.authz.answers import response_bytes
from sidecar.edge.authz.decider import described_request
from sidecar.edge.authz.fastserver import Handler as Answerer
from sidecar.edge.authz.fastserver import Question
from sidecar.edge.reviews import review_target
from sidecar.pipeline.chain import Handler, Stage, build_chain
from sidecar.pipeline.context import RequestContext, request_id_for
from sidecar.policy.source.store import PolicyStore
from sidecar.services.audit import authz_record

PATH = "/kubernetes"
VERSIONS = ("authorization.k8s.io/v1", "authorization.k8s.io/v1beta1")
KIND = "SubjectAccessReview"
MAX_REVIEW_BYTES = 256 * 1024
WEBHOOK = "webhook"


def _review(body: Any) -> tuple[str, Identity | None, dict[str, Any], str | None]:
    """(apiVersion, subject or None when it names no tenant, spec, resource tenant)."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a SubjectAccessReview JSON object")
    version = body.get("apiVersion")
    if version not in VERSIONS:
        raise bad_request(f"apiVersion must be one of {', '.join(VERSIONS)}")
    if body.get("kind") != KIND:
        raise bad_request(f"kind must be {KIND!r}")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise bad_request("a SubjectAccessReview needs a 'spec' object")
    user = spec.get("user")
    if not isinstance(user, str) or not printable(user):
        raise bad_request("spec.user must be a non-empty string")
    key = "groups" if version.endswith("/v1") else "group"
    groups = spec.get(key) or []
    if not isinstance(groups, list) or not all(isinstance(g, str) and printable(g) for g in groups):
        raise bad_request(f"spec.{key} must be a list of strings")
    extra = spec.get("extra") or {}
    if not isinstance(extra, dict):
        raise bad_request("spec.extra must be an object")
    given = extra.get("tenant") or []
    if not isinstance(given, list) or not all(isinstance(t, str) for t in given):
        raise bad_request("spec.extra.tenant must be a list of strings")
    attrs = spec.get("resourceAttributes")
    resource_tenant: str | None = None
    if isinstance(attrs, dict) and attrs.get("tenant") not in (None, ""):
        raw = attrs.get("tenant")
        if not isinstance(raw, str) or not is_dns1123_label(raw):
            raise bad_request("resourceAttributes.tenant must be a tenant name")
        resource_tenant = raw
    subject: Identity | None = None
    if given:
        tenant = given[0]
        if not is_dns1123_label(tenant):
            raise bad_request("spec.extra.tenant[0] must be a tenant name")
        subject = Identity(user, tenant, tuple(groups), WEBHOOK)
    return version, subject, spec, resource_tenant


class KubernetesWebhook:
    def __init__(
        self, policy: PolicyStore, stages: dict[str, Stage], authorize: Any, max_body: int
    ) -> None:
        self.policy = policy
        self.authorize = authorize
        self.max_body = max_body
        self.chain: Handler = build_chain(
            [stages["metrics"], stages["audit"], stages["errors"]], self._answer
        )

    async def __call__(self, question: Question) -> bytes:
        headers = CIMultiDict[str](question.headers)
        request = described_request(question.method, PATH, headers, question.remote)
        ctx = RequestContext(
            request=request,
            request_id=request_id_for(request),
            policy=self.policy.current,
            max_body_bytes=min(self.max_body, MAX_REVIEW_BYTES),
        )
        if len(question.body) > ctx.max_body_bytes:
            raise StatusError(413, "the review is too large")
        ctx.body = question.body
        response = await self.chain(ctx)
        assert isinstance(response, web.Response)
        return response_bytes(response)

    async def _answer(self, ctx: RequestContext) -> web.StreamResponse:
        if ctx.request.method != "POST":
            raise StatusError(405, "a SubjectAccessReview is POSTed", headers={"Allow": "POST"})
        version, subject, spec, resource_tenant = _review(await ctx.read_json())
        answer: dict[str, Any] = {"apiVersion": version, "kind": KIND, "metadata": {}}
        if subject is None:
            answer["status"] = {
                "allowed": False,
                "denied": False,
                "reason": "no opinion: the review names no tenant (spec.extra.tenant)",
            }
            return web.json_response(answer)
        ctx.identity = subject
        attrs = spec.get("resourceAttributes")
        if isinstance(attrs, dict) and "scope" in attrs:
            # `scope` is the sidecar's own access-review field, no SubjectAccessReview's:
            # `scope: cluster` would drop the review's tenant (Arktos'
            # resourceAttributes.tenant) and decide the caller's own tenant instead.
            attrs = {k: v for k, v in attrs.items() if k != "scope"}
            spec = {**spec, "resourceAttributes": attrs}
        target = review_target(spec, resource_tenant or subject.tenant)
        ctx.target = target
        v = await self.authorize(ctx, subject, target, read_body=False)
        ctx.decision = v
        ctx.audit["authz"] = authz_record(v)
        ctx.audit["decider"] = "kubernetes"
        status: dict[str, Any] = {"allowed": v.allowed}
        if not v.allowed:
            status["denied"] = bool(v.isolated)
            status["reason"] = v.reason
        answer["status"] = status
        return web.Response(
            body=json.dumps(answer, separators=(",", ":")).encode(),
            content_type="application/json",
        )


def handler(webhook: KubernetesWebhook) -> Answerer:
    return webhook.__call__

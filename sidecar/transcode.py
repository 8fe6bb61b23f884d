"""The transcode stage: Kubernetes protobuf request bodies become JSON (DESIGN §10).

kubectl's typed commands send `application/vnd.kubernetes.protobuf` bodies and do not
fall back to JSON on a 415. This stage runs right after the tenant rate limit (a
rate-limited caller costs no decoding) and before every stage that reads a body: it
decodes the body (`sidecar.kube_protobuf`), checks that the object's kind belongs to the
resource the request targets, and from then on the request *is* a JSON request: the
JSON is `ctx.body` (what later stages read and the upstream receives) and the request
seen by later stages carries `Content-Type: application/json` and the JSON's
`Content-Length`.

Refused, with nothing read further, stored or charged: a protobuf body of a kind the
sidecar does not read (415 naming it), one that does not decode (400), one whose kind
does not match its target (400), one with a `Content-Encoding` (415), and any CBOR body
(415: neither the sidecar nor the store reads CBOR).

A protobuf request with `Expect: 100-continue` gets its `100` here, after
authentication and rate limit but before authorization: its body must be decoded
before authorization can read it. Kubernetes clients do not send `Expect`.
"""

from __future__ import annotations

import json

from aiohttp import web
from multidict import CIMultiDict

from sidecar.context import RequestContext
from sidecar.errors import StatusError
from sidecar.kube_protobuf import MEDIA_TYPE, transcode
from sidecar.pipeline import Handler
from sidecar.target import RequestTarget

JSON = "application/json"
CBOR = "application/cbor"

# The kinds `kube_protobuf` reads → the (API group, resource) such a body may be sent to.
KIND_TARGETS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("", "configmaps"),
    "Secret": ("", "secrets"),
    "Namespace": ("", "namespaces"),
    "ServiceAccount": ("", "serviceaccounts"),
    "SelfSubjectAccessReview": ("authorization.k8s.io", "selfsubjectaccessreviews"),
    "SubjectAccessReview": ("authorization.k8s.io", "subjectaccessreviews"),
    "SelfSubjectRulesReview": ("authorization.k8s.io", "selfsubjectrulesreviews"),
    "SelfSubjectReview": ("authentication.k8s.io", "selfsubjectreviews"),
}
# A whole object: protobuf has no patch types.
_METHODS = frozenset({"POST", "PUT"})


def is_cbor(content_type: str) -> bool:
    return content_type == CBOR or content_type.endswith("+cbor")


def check_method(method: str) -> None:
    """415 for a protobuf body on a method that does not send a whole object."""
    if method not in _METHODS:
        raise StatusError(
            415, "the sidecar reads Kubernetes protobuf only in POST and PUT bodies; send JSON"
        )


def check_target(kind: str, target: RequestTarget | None) -> None:
    """400 unless a `kind` object belongs to the resource the request targets."""
    expected = KIND_TARGETS.get(kind)
    if (
        expected is None
        or target is None
        or not target.resource_request
        or target.subresource
        or (target.api_group, target.resource) != expected
    ):
        where = target.full_resource if target and target.resource_request else "this URL"
        raise StatusError(400, f"a protobuf {kind} body cannot be sent to {where}")


class TranscodeStage:
    name = "transcode"

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse:
        request = ctx.request
        if "Content-Type" not in request.headers:
            return await call_next(ctx)
        ctype = request.content_type
        if is_cbor(ctype):
            ctx.audit["transcode"] = "refused: cbor"
            raise StatusError(
                415,
                f"CBOR request bodies ({ctype}) are not supported; send JSON "
                "(e.g. `kubectl create -f object.json`)",
            )
        if ctype != MEDIA_TYPE or not request.body_exists:
            return await call_next(ctx)
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding and encoding != "identity":
            raise StatusError(
                415, f"a protobuf body may not have a Content-Encoding (got {encoding!r})"
            )
        check_method(request.method)
        kind, document = transcode(await ctx.read_body())
        check_target(kind, ctx.target)
        ctx.body = document
        ctx.parsed_body = json.loads(document)
        ctx.request = as_json_request(request, len(document))
        ctx.audit["transcode"] = kind
        return await call_next(ctx)


def as_json_request(request: web.Request, length: int) -> web.Request:
    """The same request, as later stages and the proxy should see it: a JSON body of
    `length` bytes (the proxy copies `Content-Type` from it and sizes the body itself)."""
    headers = CIMultiDict(request.headers)
    headers["Content-Type"] = JSON
    headers["Content-Length"] = str(length)
    headers.popall("Transfer-Encoding", None)
    return request.clone(headers=headers)

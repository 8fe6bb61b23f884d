"""The transcode stage: Kubernetes protobuf request bodies become JSON (DESIGN §10).

kubectl's typed commands send `application/vnd.kubernetes.protobuf` bodies and do not
fall back to JSON on a 415. This stage runs right after the tenant rate limit (a
rate-limited caller costs no decoding) and before every stage that reads a body: it
decodes the body (`sidecar.services.codecs.kube_protobuf`: a costly one in a worker process, so that
the event loop is never held by a decode, in the turn of the caller's tenant, so that
one tenant's large bodies never hold up another's), checks that the object's kind
belongs to the resource the request targets, and from then on the request *is* a JSON
request: the JSON is `ctx.body` (what later stages read and the upstream receives)
and the request seen by later stages carries `Content-Type: application/json` and the
JSON's `Content-Length`. A body whose JSON could not fit in `limits.maxBodyBytes` is 413
before it is converted.

Refused, with nothing read further, stored or charged: a protobuf body of a kind the
sidecar does not read (415 naming it), one with a field the sidecar does not know (415:
dropping it could change the object), one that does not decode or holds a string that
is not UTF-8 (400), one whose kind does not match its target (400), one too large as
JSON (413), one with a `Content-Encoding` (415), and any CBOR body (415: neither the
sidecar nor the store reads CBOR).

A protobuf request with `Expect: 100-continue` gets its `100` here, after
authentication and rate limit but before authorization: its body must be decoded
before authorization can read it. Kubernetes clients do not send `Expect`.
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

from sidecar.core.status import StatusError
from sidecar.core.target import RequestTarget
from sidecar.pipeline.chain import Handler
from sidecar.pipeline.context import RequestContext
from sidecar.services.codecs.kube_protobuf import KINDS, MEDIA_TYPE, read_kind, transcode_request
from sidecar.services.codecs.kube_protobuf.schema import OPTION_KINDS

JSON = "application/json"
CBOR = "application/cbor"

# kind → the (API group, resource) a body of that kind may be sent to (kube_protobuf's
# table; a kind name is one kind whatever its group, so the kind alone decides).
KIND_TARGETS: dict[str, tuple[str, str]] = {
    kind: (found.group, found.resource)
    for (_, kind), found in KINDS.items()
    if kind not in OPTION_KINDS
}
assert len(KIND_TARGETS) == len([k for _, k in KINDS if k not in OPTION_KINDS]), (
    "a kind name in two API groups"
)
# A whole object (protobuf has no patch types), or a DELETE's DeleteOptions.
_METHODS = frozenset({"POST", "PUT", "DELETE"})


def is_cbor(content_type: str) -> bool:
    return content_type == CBOR or content_type.endswith("+cbor")


def check_method(method: str) -> None:
    """415 for a protobuf body on a method that does not send a whole object."""
    if method not in _METHODS:
        raise StatusError(
            415,
            "the sidecar reads Kubernetes protobuf only in POST and PUT bodies (and "
            "DeleteOptions in DELETE); send JSON",
        )


def check_target(kind: str, target: RequestTarget | None) -> None:
    """400 unless a `kind` object belongs to the resource the request targets: an
    object to its resource (POST, PUT), DeleteOptions to a DELETE, an Eviction to
    `pods/{name}/eviction` (`kubectl drain`)."""
    if kind in OPTION_KINDS:
        _check_options(kind, target)
        return
    if target is not None and target.verb in ("delete", "deletecollection"):
        raise StatusError(400, f"a DELETE takes a DeleteOptions body, not a {kind}")
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


def _check_options(kind: str, target: RequestTarget | None) -> None:
    if target is None or not target.resource_request:
        raise StatusError(400, f"a protobuf {kind} body cannot be sent to this URL")
    if kind == "DeleteOptions":
        if target.verb not in ("delete", "deletecollection"):
            raise StatusError(400, "a DeleteOptions body belongs to a DELETE")
        return
    if not (
        target.verb == "create"
        and target.api_group == ""
        and target.resource == "pods"
        and target.subresource == "eviction"
        and target.name
        and not target.extra
    ):
        raise StatusError(400, "an Eviction body belongs to POST …/pods/{name}/eviction")


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
        body = await ctx.read_body()
        check_target(read_kind(body), ctx.target)  # before anything is converted
        result = await transcode_request(body, ctx.max_body_bytes, caller_tenant(ctx))
        ctx.body = result.data
        if result.document is not None:
            ctx.parsed_body = result.document
        # else (a large body, read in the worker): later stages parse `ctx.body` if
        # they need the object, as they would a JSON body of that size.
        ctx.request = as_json_request(request, len(result.data))
        ctx.audit["transcode"] = result.kind
        return await call_next(ctx)


def caller_tenant(ctx: RequestContext) -> str:
    """Whose share of the protobuf workers a body uses: the tenant of the caller who
    sent it (as the rate limit keys it), not one it impersonates."""
    return "" if ctx.identity is None else ctx.identity.sender.tenant


def as_json_request(request: web.Request, length: int) -> web.Request:
    """The same request, as later stages and the proxy should see it: a JSON body of
    `length` bytes (the proxy copies `Content-Type` from it and sizes the body itself)."""
    headers = CIMultiDict(request.headers)
    headers["Content-Type"] = JSON
    headers["Content-Length"] = str(length)
    headers.popall("Transfer-Encoding", None)
    return request.clone(headers=headers)

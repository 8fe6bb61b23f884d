"""Discovery for the API groups the sidecar serves itself (DESIGN §10).

The access reviews (`authorization.k8s.io/v1`) and `selfsubjectreviews`
(`authentication.k8s.io/v1`) are answered by the sidecar, never forwarded, so their
discovery documents are the sidecar's too: `/apis/{group}` (APIGroup) and
`/apis/{group}/v1` (APIResourceList), and the upstream's `/apis` gains both groups when
it lacks them (APIGroupList, or the aggregated APIGroupDiscoveryList a Kubernetes API
server answers). Client libraries that discover before they call (the Python dynamic
client, `kubectl api-resources`) then find SelfSubjectAccessReview.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sidecar.core.status import StatusError
from sidecar.pipeline.context import RequestContext

# group → [(plural, Kind)], every one `create` only, cluster-level in discovery (the
# tenant of a review is the caller's; DESIGN §5).
SERVED: dict[str, list[tuple[str, str]]] = {
    "authorization.k8s.io": [
        ("selfsubjectaccessreviews", "SelfSubjectAccessReview"),
        ("selfsubjectrulesreviews", "SelfSubjectRulesReview"),
        ("subjectaccessreviews", "SubjectAccessReview"),
    ],
    "authentication.k8s.io": [("selfsubjectreviews", "SelfSubjectReview")],
}
VERSION = "v1"
APIS = "/apis"
PATHS = frozenset(
    path for group in SERVED for path in (f"{APIS}/{group}", f"{APIS}/{group}/{VERSION}")
)


def _version(group: str) -> dict[str, str]:
    return {"groupVersion": f"{group}/{VERSION}", "version": VERSION}


def api_group(group: str) -> dict[str, Any]:
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [_version(group)],
        "preferredVersion": _version(group),
    }


def resource_list(group: str) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{VERSION}",
        "resources": [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": False,
                "kind": kind,
                "verbs": ["create"],
            }
            for plural, kind in SERVED[group]
        ],
    }


def _aggregated(group: str) -> dict[str, Any]:
    """One group of an `apidiscovery.k8s.io/v2` APIGroupDiscoveryList."""
    return {
        "metadata": {"name": group},
        "versions": [
            {
                "version": VERSION,
                "freshness": "Current",
                "resources": [
                    {
                        "resource": plural,
                        "singularResource": kind.lower(),
                        "responseKind": {"group": "", "version": "", "kind": kind},
                        "scope": "Cluster",
                        "verbs": ["create"],
                    }
                    for plural, kind in SERVED[group]
                ],
            }
        ],
    }


def with_served_groups(status: int, body: bytes) -> bytes:
    """The upstream's `/apis` with the sidecar's groups added where missing; any other
    answer (an error, not JSON, another kind) unchanged."""
    if status != 200:
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict):
        return body
    kind = doc.get("kind")
    if kind == "APIGroupList" and isinstance(doc.get("groups"), list):
        have = {g.get("name") for g in doc["groups"] if isinstance(g, dict)}
        doc["groups"] += [api_group(g) for g in SERVED if g not in have]
    elif kind == "APIGroupDiscoveryList" and isinstance(doc.get("items"), list):
        have = {(i.get("metadata") or {}).get("name") for i in doc["items"] if isinstance(i, dict)}
        doc["items"] += [_aggregated(g) for g in SERVED if g not in have]
    else:
        return body
    return json.dumps(doc).encode()


async def served_document(ctx: RequestContext) -> web.StreamResponse:
    """The terminal for `PATHS` (after authorization, as any non-resource URL)."""
    request = ctx.request
    if request.method not in ("GET", "HEAD"):
        raise StatusError(405, f"{request.method} is not allowed on {request.path}")
    _, _, group, *version = request.path.split("/")
    doc = resource_list(group) if version else api_group(group)
    response = web.json_response(doc)
    response.headers["X-Request-Id"] = ctx.request_id
    return response


def apis_terminal(
    forward: Callable[[RequestContext], Awaitable[web.StreamResponse]],
) -> Callable[[RequestContext], Awaitable[web.StreamResponse]]:
    """The terminal for `/apis`: forwarded, the answer read whole and completed."""

    async def terminal(ctx: RequestContext) -> web.StreamResponse:
        ctx.response_filter = with_served_groups
        return await forward(ctx)

    return terminal

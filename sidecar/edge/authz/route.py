"""Which way an allowed request goes (DESIGN §13): `direct` (the front forwards it to
the upstream itself) or `proxy` (the front hands it to the full proxy).

`direct` only where forwarding the request as received forwards exactly what was
decided, and nothing else remains to be done for it:
- a `get` or `list` (GET or HEAD) of a resource, decided final from the method, the
  target and the headers: no owner filter on the answer, no body to check (an owner
  rule on one object is decided here: the decider looks the owner up as the proxy does);
- whose target as received is already the canonical target the proxy forwards
  (`RequestTarget.upstream_target`: a short path, a tenant-context path, any encoding
  the proxy would rewrite, all go to the proxy);
- that carries no identity header of the client's own (`X-Remote-*`, `X_Remote_*`,
  `Impersonate-*`, `identity.stripHeaders`): a front strips headers by name, not by
  prefix, so only the proxy removes them all;
- whose groups can be carried by every front (no `,` in a group name: nginx reads one
  joined `x-remote-group`).
Everything else goes to the proxy: writes (quota-tracked creates and updates, deletes
that return charges, dry runs, owner-checked bodies, protobuf bodies), watches,
owner-filtered lists, non-resource URLs (discovery, `/metrics`, `/version`), access
reviews and the quota API.
"""

from __future__ import annotations

from sidecar.core.target import RequestTarget
from sidecar.edge.quota_api import PREFIX as QUOTA_PREFIX
from sidecar.edge.reviews import is_review
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.tenant_context import CONTEXT_KEY
from sidecar.policy.decision import Verdict

DIRECT, PROXY = "direct", "proxy"
# Answered by the proxy without any stage (no credentials, no rate limit).
PROBES = frozenset({"/healthz", "/readyz"})
_DIRECT_VERBS = frozenset({"get", "list"})


def is_probe(path: str) -> bool:
    return path in PROBES


def terminal_route(path: str) -> str | None:
    """`proxy` for the proxy's own terminals that decide each call themselves (the
    quota API), else None. `path` is the decoded path, as the proxy dispatches."""
    if path == QUOTA_PREFIX or path.startswith(QUOTA_PREFIX + "/"):
        return PROXY
    return None


def is_review_target(target: RequestTarget) -> bool:
    return is_review(target)


def route_for(ctx: RequestContext, v: Verdict, strip: frozenset[str] | set[str]) -> str:
    """The route of an allowed request (see the module docstring)."""
    target = v.target or ctx.target
    request = ctx.request
    if target is None or not target.resource_request:
        return PROXY
    if target.verb not in _DIRECT_VERBS or request.method not in ("GET", "HEAD"):
        return PROXY
    if v.owner.list_field or v.needs_body or v.body is not None:
        return PROXY
    if request.raw_path != target.upstream_target():
        return PROXY
    if request.get(CONTEXT_KEY) is not None:
        # `/tenants/{t}/…`: the request's raw_path is the rest after the context; the
        # front would forward the whole context path, which the upstream cannot read.
        return PROXY
    if "clientIdentityHeaders" in ctx.audit:
        return PROXY  # the client sent identity headers: only the proxy strips them all
    identity = ctx.identity
    if identity is None or any("," in g for g in identity.groups):
        return PROXY
    return DIRECT


__all__ = ["DIRECT", "PROXY", "is_probe", "route_for", "terminal_route"]

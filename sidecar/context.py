"""The per-request state that flows through the pipeline stages.

Each stage reads what earlier stages filled in and adds its own part; only the
fields here cross stage boundaries. `policy` is the policy snapshot taken when the
request started, so a reload mid-request never mixes two policies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sidecar.errors import StatusError
from sidecar.target import RequestTarget

if TYPE_CHECKING:
    from sidecar.policy.bundle import PolicyBundle
    from sidecar.policy.decision import Decision


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. `alice@acme` and `alice@beta` are different subjects."""

    user: str
    tenant: str
    groups: tuple[str, ...] = ()
    authenticator: str = ""

    @property
    def is_operator(self) -> bool:
        """Users of the `system` tenant are platform operators."""
        return self.tenant == "system"


@dataclass(slots=True)
class RequestContext:
    request: web.Request
    request_id: str
    policy: PolicyBundle
    max_body_bytes: int
    started: float = field(default_factory=time.perf_counter)
    target: RequestTarget | None = None
    identity: Identity | None = None
    decision: Decision | None = None
    # The request body, once a stage had to read it (quota or owner checks). When set,
    # the proxy forwards these bytes instead of streaming the client's body.
    body: bytes | None = None
    # Extra query parameters for the upstream call (e.g. owner filtering).
    upstream_query: list[tuple[str, str]] = field(default_factory=list)
    # Applied to the whole upstream response body (owner-filtered lists); the proxy
    # buffers the response when this is set. Gets (status, body), returns new body.
    response_filter: Callable[[int, bytes], bytes] | None = None
    # Headers added to the response, whether it is forwarded or an error.
    response_headers: dict[str, str] = field(default_factory=dict)
    # Tenant used for metrics/audit labels (the caller's, once known).
    tenant_label: str = ""
    # Per-stage notes for the audit line (e.g. {"ratelimit": "allowed"}).
    audit: dict[str, Any] = field(default_factory=dict)
    # Set when the response's status is known (forwarded or local).
    status: int = 0

    async def read_body(self) -> bytes:
        """Read the whole request body, refusing more than `max_body_bytes` with 413."""
        if self.body is not None:
            return self.body
        request = self.request
        limit = self.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise body_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(65536):
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            chunks.append(chunk)
        self.body = b"".join(chunks)
        return self.body


def body_too_large(limit: int) -> StatusError:
    return StatusError(413, f"the request body is larger than the limit of {limit} bytes")

"""The per-request state that flows through the pipeline stages.

Each stage reads what earlier stages filled in and adds its own part; only the
fields here cross stage boundaries. `policy` is the policy snapshot taken when the
request started, so a reload mid-request never mixes two policies. Facts several
stages need are computed once and kept here: the target with the caller's tenant
resolved and the caller's mode (both set by the identity stage), the parsed JSON body
(`read_json`), and the outcome (`status`, `error`) the errors stage records for the
metrics and audit stages.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sidecar.core import strict_json
from sidecar.core.identity import Identity
from sidecar.core.ids import new_id
from sidecar.core.status import StatusError, body_too_large, unauthorized
from sidecar.core.target import RequestTarget
from sidecar.wire.framing import send_continue

if TYPE_CHECKING:
    from sidecar.policy.decision import Verdict
    from sidecar.policy.owner import OwnerListFilter
    from sidecar.policy.source.bundle import PolicyBundle
    from sidecar.upstream.preconditions import DecidedState


_UNSET: Any = object()

# The status recorded for a request whose client went away before the answer.
CLIENT_CLOSED = 499
ENFORCE = "enforce"
DRY_RUN = "dry-run"

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_for(request: web.BaseRequest) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one."""
    given = request.headers.get("X-Request-Id")
    if given and _REQUEST_ID.match(given):
        return given
    return new_id()


@dataclass(slots=True)
class RequestContext:
    request: web.Request
    request_id: str
    policy: PolicyBundle
    max_body_bytes: int
    # "enforce" or "dry-run": the global mode until the identity stage knows the
    # caller's tenant, then the mode in force for that tenant (DESIGN §5).
    mode: str = ENFORCE
    started: float = field(default_factory=time.perf_counter)
    target: RequestTarget | None = None
    identity: Identity | None = None
    decision: Verdict | None = None
    # The request body, once a stage had to read it (quota or owner checks). When set,
    # the proxy forwards these bytes instead of streaming the client's body.
    body: bytes | None = None
    # Extra query parameters for the upstream call (e.g. owner filtering).
    upstream_query: list[tuple[str, str]] = field(default_factory=list)
    # Applied to the whole upstream response body (the `/apis` document the sidecar
    # completes); the proxy buffers the response when this is set. Gets (status, body),
    # returns new body.
    response_filter: Callable[[int, bytes], bytes] | None = None
    # The owner filter of a list a caller may see only through owner rules: the proxy
    # streams the answer through it (sidecar/services/listfilter.py), never buffering it whole.
    owner_list: OwnerListFilter | None = None
    # Headers added to the response, whether it is forwarded or an error.
    response_headers: dict[str, str] = field(default_factory=dict)
    # Per-stage notes for the audit line (e.g. {"ratelimit": "allowed"}).
    audit: dict[str, Any] = field(default_factory=dict)
    # Set when the response's status is known (forwarded or local).
    status: int = 0
    # The error answered instead of a response (set by the errors stage), for audit.
    error: StatusError | None = None
    # Set by a stage that must read the upstream's answer (the quota stage records the
    # created object): the proxy then reads it to its end (502 when cut short) and
    # returns a `web.Response` whose `body` holds it.
    read_whole_answer: bool = False
    # The body parsed as JSON by `read_json` (`_UNSET` until then).
    parsed_body: Any = _UNSET
    # The state of the object an earlier stage decided this write on (its owner, read
    # fresh): the write is sent holding it as a precondition (upstream/preconditions.py).
    decided_state: DecidedState | None = None

    @property
    def dry_run(self) -> bool:
        return self.mode == DRY_RUN

    def authenticated(self) -> Identity:
        """The identity the request acts as; the 401 when no identity stage set one."""
        if self.identity is None:
            raise unauthorized("authentication required")
        return self.identity

    async def read_body(self) -> bytes:
        """Read the whole request body, refusing more than `max_body_bytes` with 413.
        The body's bytes as sent, never decompressed (DESIGN §8); a pending
        `Expect: 100-continue` is answered first."""
        if self.body is not None:
            return self.body
        request = self.request
        limit = self.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise body_too_large(limit)
        await send_continue(request)
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.content.iter_chunked(65536):
                size += len(chunk)
                if size > limit:
                    raise body_too_large(limit)
                chunks.append(chunk)
        except web.RequestPayloadError:
            raise malformed_body() from None
        self.body = b"".join(chunks)
        return self.body

    async def read_json(self) -> Any:
        """The request body parsed as JSON (None when empty), for stages that must read
        it (quota-tracked and owner-checked writes, access reviews). DESIGN §7: another
        `Content-Type`, or any `Content-Encoding`, is 415 before a byte is read; bytes
        that are not JSON, or hold a number JSON cannot carry (`NaN`, `1e400`:
        `core/strict_json.py`), are 400. The raw bytes stay in `self.body` and are what the
        upstream receives, unless a stage replaces them."""
        if self.parsed_body is not _UNSET:
            return self.parsed_body
        check_json_media(self.request)
        raw = await self.read_body()
        try:
            value = strict_json.loads(raw) if raw else None
        except strict_json.NotJsonNumber as exc:
            raise StatusError(400, f"the request body is not valid JSON: {exc}") from None
        except (ValueError, UnicodeDecodeError):
            raise StatusError(400, "the request body is not valid JSON") from None
        self.parsed_body = value
        return value


_JSON_TYPES = frozenset(
    {
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
    }
)


def check_json_media(request: web.BaseRequest) -> None:
    """415 unless the body is uncompressed JSON (or one of the JSON patch types)."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding and encoding != "identity":
        raise StatusError(
            415,
            f"the sidecar must read this request body and accepts no Content-Encoding "
            f"(got {encoding!r}); send it uncompressed",
        )
    ctype = request.content_type  # "application/octet-stream" when absent
    if "Content-Type" in request.headers and ctype not in _JSON_TYPES:
        raise StatusError(
            415,
            f"the sidecar must read this request body and accepts JSON only "
            f"(got Content-Type {ctype!r})",
        )


def malformed_body() -> StatusError:
    return StatusError(400, "the request body is malformed (bad framing)")

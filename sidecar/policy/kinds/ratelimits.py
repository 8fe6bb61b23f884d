"""`kind: RateLimit` policy documents (DESIGN §6, §12): parsing and validation.

A document selects a tenant (`spec.tenant`, `"*"` = the default for every tenant
without its own document) and gives it:

- `rate` (requests per second) and `burst`: the tenant's bucket;
- `reads` / `writes` (`{rate, burst}`), optional: that class of request uses its own
  bucket instead of the tenant bucket;
- `users` (`{rate, burst}`), optional: every user of the tenant also has a bucket of
  its own, on top of the tenant's;
- `maxInFlight`, optional: at most this many requests of the tenant at once (watches
  aside: they are long-lived by design and counted by `maxWatches` instead);
- `maxWatches`, optional: at most this many open watches of the tenant at once. It has
  a default, `DEFAULT_MAX_WATCHES`, that applies to every tenant, even with no
  `RateLimit` document at all: a watch holds an upstream connection for as long as it
  lasts, so no tenant may hold them without bound.

A tenant's own document replaces the default as a whole. With no `RateLimit` document
at all, tenants are not rate-limited (`RateLimitPolicy.configured` is False).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.target import is_dns1123_label
from sidecar.policy.source.files import Document, Node, Problem

RATELIMIT_KINDS = frozenset({"RateLimit"})
DEFAULT_SELECTOR = "*"

_TOP_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec"})
_META_KEYS = frozenset({"name", "labels", "annotations"})
_SPEC_KEYS = frozenset(
    {"tenant", "rate", "burst", "maxInFlight", "maxWatches", "reads", "writes", "users"}
)
_RATE_KEYS = frozenset({"rate", "burst"})
READ_VERBS = frozenset({"get", "list", "watch", "head", "options"})
DEFAULT_MAX_WATCHES = 50


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket: `burst` requests at once, refilled at `rate` per second."""

    rate: float
    burst: int

    def __str__(self) -> str:
        return f"{self.rate:g}/s burst {self.burst}"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """The limits of one tenant (or the default), from one document."""

    rate: Rate | None = None
    reads: Rate | None = None
    writes: Rate | None = None
    users: Rate | None = None
    max_in_flight: int | None = None
    max_watches: int = DEFAULT_MAX_WATCHES
    source: str = ""

    def bucket_for(self, verb: str) -> tuple[str, Rate] | None:
        """The (bucket class, rate) a request with this verb draws from, if any."""
        if verb in READ_VERBS:
            if self.reads is not None:
                return "reads", self.reads
        elif self.writes is not None:
            return "writes", self.writes
        if self.rate is not None:
            return "all", self.rate
        return None

    def describe(self) -> str:
        parts = []
        if self.rate is not None:
            parts.append(str(self.rate))
        if self.reads is not None:
            parts.append(f"reads {self.reads}")
        if self.writes is not None:
            parts.append(f"writes {self.writes}")
        if self.users is not None:
            parts.append(f"per user {self.users}")
        if self.max_in_flight is not None:
            parts.append(f"maxInFlight {self.max_in_flight}")
        parts.append(f"maxWatches {self.max_watches}")
        return ", ".join(parts)


@dataclass(frozen=True)
class RateLimitPolicy:
    """Every `RateLimit` document, compiled. `configured` says whether any exists."""

    configured: bool = False
    default: TenantLimits | None = None
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)

    def for_tenant(self, tenant: str) -> TenantLimits | None:
        """The limits in force for a caller's tenant; None = not limited."""
        own = self.tenants.get(tenant)
        return own if own is not None else self.default

    def max_watches(self, tenant: str) -> int:
        """Open watches the tenant may hold; `DEFAULT_MAX_WATCHES` when not limited."""
        limits = self.for_tenant(tenant)
        return limits.max_watches if limits is not None else DEFAULT_MAX_WATCHES

    def describe(self) -> str:
        """One line for `/readyz` details and logs."""
        if not self.configured:
            return (
                "no RateLimit documents: tenants are not rate-limited "
                f"(maxWatches {DEFAULT_MAX_WATCHES} each)"
            )
        default = (
            self.default.describe() if self.default else "none (unlisted tenants are unlimited)"
        )
        return f"default {default}; {len(self.tenants)} tenant override(s)"


def parse_rate_limits(docs: Sequence[Document]) -> tuple[RateLimitPolicy, list[Problem]]:
    """Validate and compile every `RateLimit` document; problems carry file:line."""
    problems: list[Problem] = []
    default: TenantLimits | None = None
    tenants: dict[str, TenantLimits] = {}
    seen: dict[str, str] = {}
    configured = False
    for doc in docs:
        if doc.kind not in RATELIMIT_KINDS:
            continue
        configured = True
        parsed = _parse_doc(doc, problems)
        if parsed is None:
            continue
        selector, limits = parsed
        if selector in seen:
            what = (
                'the default (tenant "*")'
                if selector == DEFAULT_SELECTOR
                else f"tenant {selector!r}"
            )
            problems.append(
                doc.problem(
                    f"a second RateLimit for {what}; the first is at {seen[selector]}",
                    doc.body.get("spec"),
                    "tenant",
                )
            )
            continue
        seen[selector] = limits.source
        if selector == DEFAULT_SELECTOR:
            default = limits
        else:
            tenants[selector] = limits
    return RateLimitPolicy(configured, default, tenants), problems


def _parse_doc(doc: Document, problems: list[Problem]) -> tuple[str, TenantLimits] | None:
    body = doc.body
    start = len(problems)
    for key in body:
        if key not in _TOP_KEYS:
            problems.append(doc.problem(f"unknown field {key!r} in RateLimit", body, key))
    meta = body.get("metadata")
    if meta is not None:
        if not isinstance(meta, Node):
            problems.append(doc.problem("metadata must be a mapping", body, "metadata"))
        else:
            for key in meta:
                if key not in _META_KEYS:
                    problems.append(doc.problem(f"unknown field 'metadata.{key}'", meta, key))
    spec = body.get("spec")
    if not isinstance(spec, Node):
        problems.append(doc.problem("RateLimit needs a 'spec' mapping", body, "spec"))
        return None
    for key in spec:
        if key not in _SPEC_KEYS:
            allowed = ", ".join(sorted(_SPEC_KEYS))
            problems.append(
                doc.problem(f"unknown field 'spec.{key}' (allowed: {allowed})", spec, key)
            )
    selector = spec.get("tenant", DEFAULT_SELECTOR)
    if not isinstance(selector, str) or not (
        selector == DEFAULT_SELECTOR or is_dns1123_label(selector)
    ):
        problems.append(
            doc.problem(
                f'spec.tenant must be "*" or a tenant name (a DNS-1123 label), not {selector!r}',
                spec,
                "tenant",
            )
        )
        selector = None
    rate = _parse_rate(doc, spec, "spec", problems, optional=True)
    classes: dict[str, Rate | None] = {}
    for key in ("reads", "writes", "users"):
        sub = spec.get(key)
        if sub is None:
            classes[key] = None
        elif not isinstance(sub, Node):
            problems.append(doc.problem(f"spec.{key} must be a mapping {{rate, burst}}", spec, key))
            classes[key] = None
        else:
            for k in sub:
                if k not in _RATE_KEYS:
                    problems.append(doc.problem(f"unknown field 'spec.{key}.{k}'", sub, k))
            classes[key] = _parse_rate(doc, sub, f"spec.{key}", problems, optional=False)
    max_in_flight = spec.get("maxInFlight")
    if max_in_flight is not None and (
        isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1
    ):
        problems.append(
            doc.problem(
                f"spec.maxInFlight must be a whole number ≥ 1, not {max_in_flight!r}",
                spec,
                "maxInFlight",
            )
        )
        max_in_flight = None
    max_watches = spec.get("maxWatches", DEFAULT_MAX_WATCHES)
    if isinstance(max_watches, bool) or not isinstance(max_watches, int) or max_watches < 1:
        problems.append(
            doc.problem(
                f"spec.maxWatches must be a whole number ≥ 1, not {max_watches!r}",
                spec,
                "maxWatches",
            )
        )
        max_watches = DEFAULT_MAX_WATCHES
    if len(problems) > start or selector is None:
        return None
    limits = TenantLimits(
        rate=rate,
        reads=classes["reads"],
        writes=classes["writes"],
        users=classes["users"],
        max_in_flight=max_in_flight,
        max_watches=max_watches,
        source=f"{doc.file}:{doc.line}",
    )
    return selector, limits


def _parse_rate(
    doc: Document, node: Node, where: str, problems: list[Problem], *, optional: bool
) -> Rate | None:
    """`rate` and `burst` of a mapping; both or (when optional) neither."""
    has_rate, has_burst = "rate" in node, "burst" in node
    if not has_rate and not has_burst:
        if not optional:
            problems.append(doc.problem(f"{where} needs 'rate' and 'burst'", node))
        return None
    ok = True
    rate: Any = node.get("rate")
    burst: Any = node.get("burst")
    if not has_rate:
        problems.append(doc.problem(f"{where} has 'burst' but no 'rate'", node, "burst"))
        ok = False
    elif not _is_number(rate):
        problems.append(
            doc.problem(
                f"{where}.rate must be a number of requests per second, not {rate!r}", node, "rate"
            )
        )
        ok = False
    elif rate <= 0 or not math.isfinite(rate):
        problems.append(doc.problem(f"{where}.rate must be positive, not {rate!r}", node, "rate"))
        ok = False
    if not has_burst:
        problems.append(doc.problem(f"{where} has 'rate' but no 'burst'", node, "rate"))
        ok = False
    elif not _is_number(burst):
        problems.append(
            doc.problem(
                f"{where}.burst must be a whole number of requests, not {burst!r}", node, "burst"
            )
        )
        ok = False
    elif not math.isfinite(burst) or burst < 1:
        problems.append(
            doc.problem(f"{where}.burst must be at least 1, not {burst!r}", node, "burst")
        )
        ok = False
    elif burst != int(burst):
        problems.append(
            doc.problem(f"{where}.burst must be a whole number, not {burst!r}", node, "burst")
        )
        ok = False
    if not ok:
        return None
    return Rate(float(rate), int(burst))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

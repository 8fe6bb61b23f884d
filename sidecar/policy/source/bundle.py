"""A policy bundle: everything the policy directory compiles to, at one revision.

The bundle is immutable and swapped as a whole on reload, so a request that took a
snapshot at its start is decided by exactly one policy. Each subsystem owns the
validation of its own kinds and plugs in here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.policy.engine import RBAC_KINDS, PolicyEngine, compile_engine
from sidecar.policy.kinds.modes import MODE_KINDS, parse_tenant_modes
from sidecar.policy.kinds.quotas import QUOTA_KINDS, QuotaPolicy, parse_quotas
from sidecar.policy.kinds.ratelimits import RATELIMIT_KINDS, RateLimitPolicy, parse_rate_limits
from sidecar.policy.source.files import (
    Document,
    LoadResult,
    Problem,
    collector_paused,
    load_documents,
)

TEST_KINDS = frozenset({"PolicyTest"})
KNOWN_KINDS = RBAC_KINDS | RATELIMIT_KINDS | QUOTA_KINDS | MODE_KINDS | TEST_KINDS


@dataclass(frozen=True)
class PolicyBundle:
    revision: str
    engine: PolicyEngine
    rate_limits: RateLimitPolicy
    quotas: QuotaPolicy
    # Per-tenant mode overrides ("enforce" | "dry-run") from the policy files.
    tenant_modes: Mapping[str, str] = field(default_factory=dict)
    documents: tuple[Document, ...] = ()

    @property
    def tests(self) -> list[Document]:
        return [d for d in self.documents if d.kind in TEST_KINDS]


def build_bundle(result: LoadResult) -> tuple[PolicyBundle, list[Problem]]:
    """Compile loaded documents. Problems are returned, never raised; a bundle with
    problems must not be put in force (the caller decides)."""
    with collector_paused():
        return _build_bundle(result)


def _build_bundle(result: LoadResult) -> tuple[PolicyBundle, list[Problem]]:
    problems = list(result.problems)
    docs = result.documents
    for doc in docs:
        if doc.kind not in KNOWN_KINDS:
            problems.append(doc.problem(f"unknown kind {doc.kind!r}", doc.body, "kind"))
    engine, p1 = compile_engine(docs, result.revision)
    rate_limits, p2 = parse_rate_limits(docs)
    quotas, p3 = parse_quotas(docs)
    modes, p4 = parse_tenant_modes(docs)
    problems += p1 + p2 + p3 + p4
    bundle = PolicyBundle(result.revision, engine, rate_limits, quotas, modes, tuple(docs))
    return bundle, sorted(problems, key=lambda p: (p.file, p.line))


def load_bundle(paths: Sequence[str | Path]) -> tuple[PolicyBundle, list[Problem]]:
    return build_bundle(load_documents(paths))

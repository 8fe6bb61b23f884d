"""Quota policy kinds: `QuotaDefaults`, `TenantResourceQuota`, `ResourceQuota` (DESIGN §12).

Owns their validation (problems with file:line for negative or fractional limits,
unknown quota resources, unparsable quantities, missing or duplicate scopes) and the
`QuotaPolicy` value: limits in the ledger's integer units (`sidecar/core/quantities.py`).
Limits set through the quota API live in the ledger, not here; `effective_limits`
merges both. The quota stage and API (`sidecar/services/quota/`) enforce what this describes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.quantities import QUOTA_RESOURCES, QuantityError, exact_units
from sidecar.core.target import is_dns1123_label
from sidecar.policy.source.files import Document, Node, Problem

QUOTA_KINDS = frozenset({"QuotaDefaults", "TenantResourceQuota", "ResourceQuota"})

Limits = dict[str, int]


@dataclass(frozen=True)
class QuotaPolicy:
    configured: bool = False
    defaults: Mapping[str, int] = field(default_factory=dict)
    tenants: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    namespaces: Mapping[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)
    # Namespace limits set by ResourceQuota objects stored through the API (DESIGN §5):
    # (tenant, namespace) → the resources whose limit came from one.
    from_objects: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    def tenant_limits(self, tenant: str) -> tuple[Limits, dict[str, str]]:
        """The file limits of a tenant and where each came from (default or file)."""
        limits = dict(self.defaults)
        source = dict.fromkeys(self.defaults, "default")
        for res, hard in self.tenants.get(tenant, {}).items():
            limits[res] = hard
            source[res] = "file"
        return limits, source

    def namespace_limits(self, tenant: str, namespace: str) -> Limits:
        return dict(self.namespaces.get((tenant, namespace), {}))

    def namespace_sources(self, tenant: str, namespace: str) -> dict[str, str]:
        """Where each namespace limit came from: `file` or `object` (a ResourceQuota
        stored through the API, when it is the lower)."""
        objects = self.from_objects.get((tenant, namespace), frozenset())
        limits = self.namespaces.get((tenant, namespace), {})
        return {r: "object" if r in objects else "file" for r in limits}


def effective_limits(
    file_limits: Mapping[str, int], file_source: Mapping[str, str], api: Mapping[str, int]
) -> tuple[Limits, dict[str, str]]:
    """API-set limits override the file ones (an admin's update wins until removed)."""
    limits = dict(file_limits)
    source = dict(file_source)
    for res, hard in api.items():
        limits[res] = hard
        source[res] = "api"
    return limits, source


def parse_quotas(docs: Sequence[Document]) -> tuple[QuotaPolicy, list[Problem]]:
    problems: list[Problem] = []
    defaults: Limits | None = None
    tenants: dict[str, Limits] = {}
    namespaces: dict[tuple[str, str], Limits] = {}
    configured = False
    for doc in docs:
        if doc.kind not in QUOTA_KINDS:
            continue
        configured = True
        hard = _hard(doc, problems)
        if hard is None:
            continue
        if doc.kind == "QuotaDefaults":
            if defaults is not None:
                problems.append(doc.problem("a second QuotaDefaults document", doc.body, "kind"))
                continue
            defaults = hard
            continue
        meta = doc.body.get("metadata")
        if not isinstance(meta, Node):
            problems.append(doc.problem(f"{doc.kind} needs metadata.tenant", doc.body))
            continue
        tenant = _label(doc, meta, "tenant", problems)
        if tenant is None:
            continue
        if doc.kind == "TenantResourceQuota":
            if tenant in tenants:
                problems.append(
                    doc.problem(
                        f"a second TenantResourceQuota for tenant {tenant!r}", meta, "tenant"
                    )
                )
                continue
            tenants[tenant] = hard
        else:
            namespace = _label(doc, meta, "namespace", problems)
            if namespace is None:
                continue
            key = (tenant, namespace)
            if key in namespaces:
                problems.append(
                    doc.problem(
                        f"a second ResourceQuota for namespace {tenant}/{namespace}",
                        meta,
                        "namespace",
                    )
                )
                continue
            namespaces[key] = hard
    return QuotaPolicy(configured, defaults or {}, tenants, namespaces), problems


def _label(doc: Document, meta: Node, key: str, problems: list[Problem]) -> str | None:
    value = meta.get(key)
    if not isinstance(value, str) or not is_dns1123_label(value):
        problems.append(
            doc.problem(
                f"{doc.kind} needs metadata.{key} (a DNS-1123 label), got {value!r}", meta, key
            )
        )
        return None
    return value


def _hard(doc: Document, problems: list[Problem]) -> Limits | None:
    spec = doc.body.get("spec")
    if not isinstance(spec, Node):
        problems.append(doc.problem(f"{doc.kind} needs spec.hard", doc.body, "spec"))
        return None
    for key in spec:
        if key != "hard":
            problems.append(doc.problem(f"unknown field spec.{key}", spec, key))
    hard = spec.get("hard")
    if not isinstance(hard, Node):
        problems.append(doc.problem("spec.hard must be a mapping of resource: limit", spec, "hard"))
        return None
    limits: Limits = {}
    ok = True
    for res, value in hard.items():
        error = limit_error(res, value)
        if error:
            problems.append(doc.problem(error, hard, res))
            ok = False
            continue
        limits[res] = exact_units(res, value)
    return limits if ok else None


def limit_error(resource: str, value: Any) -> str | None:
    """Why `value` is not a valid hard limit for `resource`, or None when it is."""
    if resource not in QUOTA_RESOURCES:
        known = ", ".join(sorted(QUOTA_RESOURCES))
        return f"unknown quota resource {resource!r} (known: {known})"
    if isinstance(value, bool) or value is None:
        return f"hard limit for {resource} must be a number, not {value!r}"
    if isinstance(value, (int, float)) and value < 0:
        return f"hard limit for {resource} must not be negative, got {value!r}"
    if resource not in ("requests.cpu", "requests.memory"):
        if isinstance(value, float) and not value.is_integer():
            return f"hard limit for {resource} must be an integer, got {value!r}"
        if isinstance(value, str):
            return f"hard limit for {resource} must be an integer, got {value!r}"
    try:
        exact_units(resource, value)
    except QuantityError as exc:
        return f"hard limit for {resource}: {exc}"
    return None

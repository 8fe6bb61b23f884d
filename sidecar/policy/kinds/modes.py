"""Enforcement modes: `enforce` or `dry-run`, globally (config `mode`) and per tenant
(`kind: TenantMode` documents in the policy files).

A `TenantMode` document overrides the global mode for the callers of one tenant, for
authorization, rate limits and quotas alike:

    kind: TenantMode
    metadata: {name: sandbox-dry-run}
    spec: {tenant: sandbox, mode: dry-run}

This module owns the kind's validation, the lookup `mode_for` (and `mode_source`:
where the mode comes from), and what a mode does to a verdict: `forwards` (the live
request is forwarded) and `live` (that, in words, for `policy explain`, `can-i` and
access reviews). Which refusals a mode may relax is not decided here but by the one
decision function (`Verdict.relaxable`, `policy/decide.py`): only refusals inside the
caller's own tenant; isolation, concealment, owner rules, impersonation and reviews
hold in every mode. The rate-limit and quota stages relax their own refusals, which
are the caller's tenant's (its buckets; a quota of its own tenant,
`isolation.inside_caller_tenant`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sidecar.core.target import is_dns1123_label
from sidecar.policy.decision import Verdict
from sidecar.policy.source.files import Document, Node, Problem

MODE_KINDS = frozenset({"TenantMode"})
ENFORCE = "enforce"
DRY_RUN = "dry-run"
MODES = (ENFORCE, DRY_RUN)

_TOP_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec"})
_META_FIELDS = frozenset({"name", "annotations", "labels"})
_SPEC_FIELDS = frozenset({"tenant", "mode"})


def mode_for(global_mode: str, tenant_modes: Mapping[str, str], tenant: str | None) -> str:
    """The mode for a caller's tenant: its override if any, else the global mode."""
    if tenant is not None:
        override = tenant_modes.get(tenant)
        if override is not None:
            return override
    return global_mode


def mode_source(tenant_modes: Mapping[str, str], tenant: str | None) -> str:
    """Where the caller's mode comes from: "tenant T" (a TenantMode) or "global"."""
    if tenant is not None and tenant in tenant_modes:
        return f"tenant {tenant}"
    return "global"


def forwards(verdict: Verdict, mode: str) -> bool:
    """Whether the live request with this verdict is forwarded in `mode`: allowed, or
    a refusal the verdict says a mode may relax, in dry-run."""
    return verdict.allowed or (mode == DRY_RUN and verdict.relaxable)


def live(verdict: Verdict, mode: str) -> str:
    """What the live request gets in `mode`, in words ("forwarded", "would deny,
    forwarded", "denied (HTTP 403), in every mode: …")."""
    if verdict.outcome == "filter":
        t = verdict.target
        return (
            "forwarded, owner-filtered"
            if t is None or t.verb in ("list", "watch")
            else "forwarded, owner set"
        )
    if verdict.allowed:
        return "forwarded"
    would = "would deny" if verdict.outcome == "deny" else f"would answer {verdict.status}"
    if forwards(verdict, mode):
        checked = " if its owner fields are the caller's tenant" if verdict.needs_body else ""
        return f"{would}, forwarded{checked}"
    refused = "denied" if verdict.outcome == "deny" else "not found"
    if mode == DRY_RUN and verdict.held:
        return f"{refused} (HTTP {verdict.status}), not relaxed: {verdict.held}"
    return f"{refused} (HTTP {verdict.status})"


def summary(mode: str, source: str, tenant: str) -> str:
    """What the caller's mode means for all its requests (`policy can-i --list`)."""
    if mode != DRY_RUN:
        return f"{mode} ({source}): every refusal is answered"
    return (
        f"{mode} ({source}): refusals inside tenant {tenant} (RBAC 403s, rate limits, "
        "quotas) are logged and forwarded; isolation, concealment (404s), the cluster "
        "level, owner rules, impersonation and access reviews hold"
    )


def describe(mode: str, source: str, verdict: Verdict) -> str:
    """`mode: dry-run (tenant acme): would deny, forwarded`: the mode in force for the
    caller, where it comes from, and what the live request gets."""
    return f"{mode} ({source}): {live(verdict, mode)}"


def parse_tenant_modes(docs: Sequence[Document]) -> tuple[dict[str, str], list[Problem]]:
    """Validate every `TenantMode` document; returns tenant → mode and the problems."""
    modes: dict[str, str] = {}
    problems: list[Problem] = []
    first_for_tenant: dict[str, Document] = {}
    names: dict[str, Document] = {}
    for doc in docs:
        if doc.kind not in MODE_KINDS:
            continue
        before = len(problems)
        tenant, mode = _parse_one(doc, problems)
        name = doc.name
        if name:
            if name in names:
                other = names[name]
                problems.append(
                    doc.problem(
                        f"duplicate TenantMode name {name!r} (also at {other.file}:{other.line})",
                        doc.body.get("metadata"),
                        "name",
                    )
                )
            else:
                names[name] = doc
        if tenant is None or mode is None or len(problems) > before:
            continue
        if tenant in first_for_tenant:
            other = first_for_tenant[tenant]
            problems.append(
                doc.problem(
                    f"tenant {tenant!r} already has a TenantMode ({other.file}:{other.line})",
                    doc.body.get("spec"),
                    "tenant",
                )
            )
            continue
        first_for_tenant[tenant] = doc
        modes[tenant] = mode
    return modes, problems


def _parse_one(doc: Document, problems: list[Problem]) -> tuple[str | None, str | None]:
    body = doc.body
    for key in body:
        if key not in _TOP_FIELDS:
            problems.append(doc.problem(f"unknown field {key!r} in TenantMode", body, key))
    meta = body.get("metadata")
    if not isinstance(meta, Node):
        problems.append(doc.problem("TenantMode needs metadata.name", body, "metadata"))
    else:
        for key in meta:
            if key not in _META_FIELDS:
                problems.append(doc.problem(f"unknown field 'metadata.{key}'", meta, key))
        if not isinstance(meta.get("name"), str) or not meta.get("name"):
            problems.append(doc.problem("TenantMode needs metadata.name", meta, "name"))
    spec = body.get("spec")
    if not isinstance(spec, Node):
        problems.append(
            doc.problem("TenantMode needs a spec with 'tenant' and 'mode'", body, "spec")
        )
        return None, None
    for key in spec:
        if key not in _SPEC_FIELDS:
            problems.append(doc.problem(f"unknown field 'spec.{key}' in TenantMode", spec, key))
    tenant = spec.get("tenant")
    mode = spec.get("mode")
    ok_tenant: str | None = None
    ok_mode: str | None = None
    if not isinstance(tenant, str) or not tenant:
        problems.append(doc.problem("TenantMode spec.tenant must be a tenant name", spec, "tenant"))
    elif not is_dns1123_label(tenant) or len(tenant) > 63:
        problems.append(
            doc.problem(
                f"TenantMode spec.tenant {tenant!r} is not a valid tenant name "
                "(a DNS-1123 label; the global mode is set in the config, not with '*')",
                spec,
                "tenant",
            )
        )
    else:
        ok_tenant = tenant
    if mode not in MODES:
        hint = " (YAML reads on/off/yes/no as booleans; quote the value)"
        problems.append(
            doc.problem(
                f"TenantMode spec.mode must be 'enforce' or 'dry-run', not {mode!r}"
                + (hint if isinstance(mode, bool) else ""),
                spec,
                "mode",
            )
        )
    else:
        ok_mode = str(mode)
    return ok_tenant, ok_mode

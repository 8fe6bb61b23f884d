"""Checks `sidecar policy check` runs on top of each kind's own validation.

- Reserved tenants: `system` and `default` always exist and nobody creates or deletes
  them, so a rule that names them in `resourceNames` to create or delete tenants is a
  mistake (it could never take effect) and is reported.
- Warnings (printed, never failing the check): an owner rule (`when: owner`) on a
  resource that may be namespaced. Owner rules reach cluster-scoped objects only
  (DESIGN §5), so such a rule never grants another tenant's objects; its author
  probably expected it to.
- Lint (`lint`, warnings too, failing only `policy check --strict`): see `lint`; and
  `mode_warnings`: a `TenantMode` that puts a tenant in dry-run (its refusals inside
  its own tenant are forwarded), so `check --strict` never waves a mode change through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sidecar.core.target import RESERVED_TENANTS, SYSTEM_TENANT
from sidecar.policy.decide import REVIEWS
from sidecar.policy.kinds.modes import DRY_RUN, MODE_KINDS
from sidecar.policy.rbac import CLUSTER_ROLE_BINDING, TENANT_ROLE_BINDING, RbacPolicy, Rule
from sidecar.policy.scopes import is_cluster_scoped, is_tenant_scoped, owner_rule_warning
from sidecar.policy.source.files import Document, Node, NodeList, Problem
from sidecar.policy.tools.diff import Atom, rule_atoms

_ROLE_KINDS = frozenset({"ClusterRole", "TenantRole", "Role"})
_LIFECYCLE_VERBS = frozenset({"create", "delete", "deletecollection", "*"})


def cross_document_problems(docs: Sequence[Document]) -> list[Problem]:
    problems: list[Problem] = []
    for doc in docs:
        if doc.kind in _ROLE_KINDS:
            problems.extend(_reserved_tenant_rules(doc))
    return problems


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _reserved_tenant_rules(doc: Document) -> list[Problem]:
    out: list[Problem] = []
    rules = doc.body.get("rules")
    if not isinstance(rules, NodeList):
        return out
    for rule in rules:
        if not isinstance(rule, Node):
            continue
        groups = _strings(rule.get("apiGroups"))
        resources = _strings(rule.get("resources"))
        if not ({"", "*"} & set(groups)) or not ({"tenants", "*"} & set(resources)):
            continue
        verbs = sorted(_LIFECYCLE_VERBS & set(_strings(rule.get("verbs"))))
        if not verbs:
            continue
        names = rule.get("resourceNames")
        for i, name in enumerate(_strings(names)):
            if name in RESERVED_TENANTS:
                line = names.line_of(i) if isinstance(names, NodeList) else rule.line
                out.append(
                    Problem(
                        doc.file,
                        line,
                        f"tenant {name!r} is reserved: it always exists and nobody creates or "
                        f"deletes it, so granting {', '.join(verbs)} on it has no effect",
                    )
                )
    return out


def warnings(docs: Sequence[Document]) -> list[Problem]:
    """Things `policy check` points out without failing (`file:line: WARNING: …`)."""
    out: list[Problem] = []
    for doc in docs:
        if doc.kind not in _ROLE_KINDS:
            continue
        rules = doc.body.get("rules")
        if not isinstance(rules, NodeList):
            continue
        for i, rule in enumerate(rules):
            if not isinstance(rule, Node) or rule.get("when") != "owner":
                continue
            message = owner_rule_warning(
                _strings(rule.get("apiGroups")), _strings(rule.get("resources"))
            )
            if message:
                out.append(Problem(doc.file, rules.line_of(i), message))
    return out


def lint(policy: RbacPolicy) -> list[Problem]:
    """Warnings about the RBAC policy as a whole (`policy check`; they fail only with
    `--strict`): roles nothing binds, bindings to roles that grant nothing, rules
    wholly shadowed by a broader rule of the same subject, owner rules on tenant-scoped
    resources (namespaced ones: `warnings`), TenantRoleBindings granting every verb
    on every resource, and ClusterRoleBindings that give every tenant's users access
    inside every tenant (`_every_tenant`)."""
    out: list[Problem] = []
    bound = {b.role.key for b in policy.bindings}
    for role in policy.roles.values():
        if role.key not in bound:
            out.append(Problem(role.file, role.line, f"WARNING: {role.label} is bound by nothing"))
        for rule in role.rules:
            if (
                rule.owner
                and rule.resources
                and _all_tenant_scoped(rule.api_groups, rule.resources)
            ):
                out.append(_at(rule.rule_id, (
                    f"WARNING: 'when: owner' on tenant-scoped {', '.join(rule.resources)}: owner "
                    "rules never reach another tenant's objects, so this rule only filters "
                    "objects inside the binding's own tenant"
                )))  # fmt: skip
    for b in policy.bindings:
        if not b.role.rules:
            out.append(
                Problem(
                    b.file, b.line, f"WARNING: {b.label} binds {b.role.label}, which grants nothing"
                )
            )
        if b.kind == TENANT_ROLE_BINDING and any(
            "*" in r.verbs and "*" in r.resources and "*" in r.api_groups and not r.owner
            for r in b.role.rules
        ):
            out.append(Problem(b.file, b.line, (
                f"WARNING: {b.label} grants every verb on every resource ('*' on '*') in "
                f"tenant {b.tenant!r} through {b.role.label}"
            )))  # fmt: skip
    out += _shadowed(policy)
    out += _every_tenant(policy)
    return sorted(set(out), key=lambda p: (p.file, p.line, p.message))


def _every_tenant(policy: RbacPolicy) -> list[Problem]:
    """A ClusterRoleBinding is in force in every tenant: bound to a group every
    tenant's users carry (`system:authenticated`, or a group it names in every tenant
    the policy knows, at least two), a rule on resources that live inside tenants
    gives each tenant's users that access in every other tenant too."""
    tenants = {b.tenant for b in policy.bindings if b.tenant and b.tenant != SYSTEM_TENANT}
    tenants |= {
        s.tenant
        for b in policy.bindings
        for s in b.subjects
        if s.tenant not in ("*", SYSTEM_TENANT)
    }
    out: list[Problem] = []
    for b in policy.bindings:
        if b.kind != CLUSTER_ROLE_BINDING:
            continue
        resources = sorted({r for rule in b.role.rules for r in _inside_tenants(rule)})
        if not resources:
            continue
        named: dict[str, set[str]] = {}
        who: list[str] = []
        for s in b.subjects:
            if s.kind != "Group":
                continue
            if s.tenant == "*":
                who.append(f"group {s.name!r} (every tenant's users)")
            else:
                named.setdefault(s.name, set()).add(s.tenant)
        if len(tenants) >= 2:
            who += [
                f"group {name!r} of every tenant ({', '.join(sorted(ts))})"
                for name, ts in sorted(named.items())
                if ts >= tenants
            ]
        if not who:
            continue
        out.append(Problem(b.file, b.line, (
            f"WARNING: {b.label} grants {', '.join(resources)} through {b.role.label} to "
            f"{'; '.join(who)}: a ClusterRoleBinding is in force in every tenant, so each "
            "tenant's users get this access inside every other tenant (bind it per tenant "
            "with TenantRoleBindings)"
        )))  # fmt: skip
    return out


def _inside_tenants(rule: Rule) -> list[str]:
    """The resources of a rule that live inside tenants (not cluster-scoped objects,
    nor the reviews every caller may make of its own access)."""
    return [
        resource
        for resource in rule.resources
        if any(
            group == "*"
            or resource.startswith("*")
            or not (
                (group, resource.partition("/")[0]) in REVIEWS or is_cluster_scoped(group, resource)
            )
            for group in rule.api_groups
        )
    ]


def mode_warnings(docs: Sequence[Document]) -> list[Problem]:
    """A `TenantMode` that puts a tenant in dry-run (lint: fails `check --strict`)."""
    out: list[Problem] = []
    for doc in docs:
        if doc.kind not in MODE_KINDS:
            continue
        spec = doc.body.get("spec")
        if not isinstance(spec, Node) or spec.get("mode") != DRY_RUN:
            continue
        tenant = spec.get("tenant")
        out.append(doc.problem(
            f"WARNING: TenantMode {doc.name} puts tenant {tenant!r} in dry-run: its refusals "
            f"inside tenant {tenant!r} (RBAC 403s, rate limits, quotas) are logged and "
            "forwarded, not answered",
            spec,
            "mode",
        ))  # fmt: skip
    return out


def _at(rule_id: str, message: str) -> Problem:
    file, _, line = rule_id.rpartition(":")
    return Problem(file, int(line) if line.isdigit() else 0, message)


def _all_tenant_scoped(groups: Sequence[str], resources: Sequence[str]) -> bool:
    known = [g for g in groups if g != "*"]
    return bool(known) and all(
        any(is_tenant_scoped(g, r) for g in known) and r != "*" for r in resources
    )


def _shadowed(policy: RbacPolicy) -> list[Problem]:
    """A rule in force for a subject through one binding, every request of which another
    rule in force for the same subject at the same or a broader scope already grants."""
    # subject → [(domain, rule, atoms, via)]
    held: dict[str, list[tuple[str, Rule, list[Atom], str]]] = {}
    for b in policy.bindings:
        for rule in b.role.rules:
            atoms = rule_atoms(rule)
            via = f"{b.label} → {b.role.label} → rule {rule.rule_id}"
            for s in b.subjects:
                held.setdefault(s.key, []).append((b.domain, rule, atoms, via))
    out: list[Problem] = []
    for entries in held.values():
        for dom, rule, atoms, via in entries:
            for odom, other, oatoms, ovia in entries:
                if other.rule_id == rule.rule_id and odom == dom:
                    continue
                if not (odom == "*" or odom == dom or dom.startswith(f"{odom}/")):
                    continue
                if other.owner and (not rule.owner or other.owner_field != rule.owner_field):
                    continue
                if all(any(a.within(o) for o in oatoms) for a in atoms) and not (
                    odom == dom
                    and all(any(o.within(a) for a in atoms) for o in oatoms)
                    and other.rule_id > rule.rule_id
                ):
                    out.append(_at(rule.rule_id, (
                        f"WARNING: rule shadowed: everything {via} grants is already granted "
                        f"by {ovia}"
                    )))  # fmt: skip
                    break
    return out

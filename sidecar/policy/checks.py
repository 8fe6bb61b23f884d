"""Checks `sidecar policy check` runs on top of each kind's own validation.

- Reserved tenants: `system` and `default` always exist and nobody creates or deletes
  them, so a rule that names them in `resourceNames` to create or delete tenants is a
  mistake (it could never take effect) and is reported.
- Warnings (printed, never failing the check): an owner rule (`when: owner`) on a
  resource that may be namespaced. Owner rules reach cluster-scoped objects only
  (DESIGN §5), so such a rule never grants another tenant's objects; its author
  probably expected it to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sidecar.policy.files import Document, Node, NodeList, Problem
from sidecar.policy.scopes import owner_rule_warning
from sidecar.target import DEFAULT_TENANT, SYSTEM_TENANT

RESERVED_TENANTS = (SYSTEM_TENANT, DEFAULT_TENANT)
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

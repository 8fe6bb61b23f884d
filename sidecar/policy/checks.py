"""Checks `sidecar policy check` runs on top of each kind's own validation.

- Reserved tenants: `system` and `default` always exist and nobody creates or deletes
  them, so a rule that names them in `resourceNames` to create or delete tenants is a
  mistake (it could never take effect) and is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sidecar.policy.files import Document, Node, NodeList, Problem
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

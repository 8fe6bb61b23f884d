"""The rules in force for an identity in a tenant or namespace (`can-i --list`).

Owns the one computation behind `POST …/selfsubjectrulesreviews` (`sidecar/edge/reviews.py`)
and `sidecar policy can-i --list`: every rule of every role bound to the caller by a
binding in force there — RoleBindings of that namespace, TenantRoleBindings of that
tenant, ClusterRoleBindings — in Kubernetes' `ResourceRule` / `NonResourceRule` shape.

Owner rules (`when: owner`) grant nothing unconditionally, so they are kept apart
(`owner_rules`, with their owner field): the rules review leaves them out of
`resourceRules`, which Kubernetes clients read as unconditional grants, and the CLI
can show them marked. Non-resource URLs are granted by ClusterRoleBindings only (the
engine's domains for a non-resource request), so only those are listed. A rule from a
tenant's own binding is listed as written, though at the cluster level it reaches
nothing but owned objects (as Kubernetes lists a RoleBinding's `*` rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sidecar.core.identity import Identity
from sidecar.core.target import is_dns1123_label
from sidecar.policy.engine import PolicyEngine


@dataclass(frozen=True, slots=True)
class ResourceRule:
    verbs: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    resource_names: tuple[str, ...] = ()
    # For owner rules: the field whose value must be the caller's tenant.
    owner_field: str = ""
    # "binding → role → rule", for the CLI.
    via: str = ""

    def as_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verbs": list(self.verbs),
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
        }
        if self.resource_names:
            out["resourceNames"] = list(self.resource_names)
        return out


@dataclass(frozen=True, slots=True)
class NonResourceRule:
    verbs: tuple[str, ...]
    non_resource_urls: tuple[str, ...]
    via: str = ""

    def as_k8s(self) -> dict[str, Any]:
        return {"verbs": list(self.verbs), "nonResourceURLs": list(self.non_resource_urls)}


@dataclass
class RulesInForce:
    resource_rules: list[ResourceRule] = field(default_factory=list)
    non_resource_rules: list[NonResourceRule] = field(default_factory=list)
    owner_rules: list[ResourceRule] = field(default_factory=list)


def rules_in_force(
    engine: PolicyEngine, identity: Identity, tenant: str, namespace: str = ""
) -> RulesInForce:
    """The rules in force for `identity` in `tenant` (and `namespace`, when given)."""
    out = RulesInForce()
    if not is_dns1123_label(identity.tenant) or not is_dns1123_label(tenant):
        return out
    domains = ["*", tenant]
    if namespace:
        domains.append(f"{tenant}/{namespace}")
    roles = engine.policy.roles
    by_key = {role.key: role for role in roles.values()}
    seen: set[tuple[Any, ...]] = set()
    for role_key, binding, domain in engine.bound_roles(identity, domains):
        role = by_key.get(role_key)
        if role is None:
            continue
        for rule in role.rules:
            via = f"{binding} → {role.label} → rule {rule.rule_id}"
            if rule.non_resource_urls:
                if domain != "*":
                    continue
                key: tuple[Any, ...] = ("url", rule.verbs, rule.non_resource_urls)
                if key not in seen:
                    seen.add(key)
                    out.non_resource_rules.append(
                        NonResourceRule(rule.verbs, rule.non_resource_urls, via)
                    )
                continue
            resource_rule = ResourceRule(
                rule.verbs,
                rule.api_groups,
                rule.resources,
                rule.resource_names,
                rule.owner_field if rule.owner else "",
                via,
            )
            key = (
                "res",
                rule.verbs,
                rule.api_groups,
                rule.resources,
                rule.resource_names,
                resource_rule.owner_field,
            )
            if key in seen:
                continue
            seen.add(key)
            (out.owner_rules if rule.owner else out.resource_rules).append(resource_rule)
    return out

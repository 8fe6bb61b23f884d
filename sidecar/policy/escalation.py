"""Escalation prevention for RBAC objects written through the API (DESIGN §5).

As Kubernetes does it (`research/api-policy.md`): a user may create or update a Role or
TenantRole only with rules it already holds in that scope, unless it may `escalate` on
that kind; it may bind a role only if it holds every rule of that role in the
binding's scope, unless it may `bind` that role. "Holds" compares rule coverage: every
(verb, group, resource, name) a rule grants must be granted to the requester there by
the rules in force for it (`tools/rules.py`, the same computation as `can-i --list`).
Pure: the write guard (`sidecar/pipeline/rbacguard.py`) calls it with the policy in
force.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.rbac import CLUSTER_ROLE, ROLE, TENANT_ROLE, RoleDef, Rule
from sidecar.policy.source.api import RBAC_GROUP, ApiBindingDef, rule_text
from sidecar.policy.tools.rules import NonResourceRule, ResourceRule, RulesInForce, rules_in_force

# A rule whose combinations exceed this is not checked one by one: only `escalate`
# (or `bind`) allows it.
MAX_COMBINATIONS = 50_000

RESOURCE_OF_ROLE_KIND = {CLUSTER_ROLE: "clusterroles", TENANT_ROLE: "tenantroles", ROLE: "roles"}


def may(
    engine: PolicyEngine,
    identity: Identity,
    verb: str,
    resource: str,
    tenant: str,
    namespace: str,
    name: str,
    *,
    cluster_wide: bool = False,
) -> bool:
    """Whether the policy grants `verb` on an RBAC object (`escalate`, `bind`);
    `cluster_wide`: through a ClusterRoleBinding."""
    target = RequestTarget(
        path="",
        verb=verb,
        resource_request=True,
        api_group=RBAC_GROUP,
        api_version="v1",
        scope=Scope.NAMESPACE if namespace else Scope.TENANT,
        tenant=tenant,
        namespace=namespace or None,
        resource=resource,
        name=name,
    )
    domains = ("*",) if cluster_wide else None
    return engine.match(identity, target, domains=domains).unconditional is not None


def _covers_resource(held: ResourceRule, verb: str, group: str, resource: str, name: str) -> bool:
    if "*" not in held.verbs and verb not in held.verbs:
        return False
    if "*" not in held.api_groups and group not in held.api_groups:
        return False
    if "*" not in held.resources and resource not in held.resources:
        _, slash, sub = resource.partition("/")
        if not slash or f"*/{sub}" not in held.resources:
            return False
    if held.resource_names:
        return bool(name) and name in held.resource_names
    return True


def _covers_url(held: NonResourceRule, verb: str, url: str) -> bool:
    if "*" not in held.verbs and verb not in held.verbs:
        return False
    for pattern in held.non_resource_urls:
        if pattern == "*" or pattern == url:
            return True
        if pattern.endswith("*") and url.startswith(pattern[:-1]):
            return True
    return False


def covered(
    held: RulesInForce, rule: Rule, cluster_wide: Sequence[ResourceRule] = ()
) -> bool | None:
    """Whether the rules held cover `rule`; None when it has too many combinations.
    `cluster_wide`: the unconditional rules held through ClusterRoleBindings."""
    verbs = sorted(set(rule.verbs))
    if rule.non_resource_urls:
        urls = sorted(set(rule.non_resource_urls))
        if len(verbs) * len(urls) > MAX_COMBINATIONS:
            return None
        return all(
            any(_covers_url(h, v, u) for h in held.non_resource_rules) for v in verbs for u in urls
        )
    groups = sorted(set(rule.api_groups))
    resources = sorted(set(rule.resources))
    names = sorted(set(rule.resource_names)) or [""]
    if len(verbs) * len(groups) * len(resources) * len(names) > MAX_COMBINATIONS:
        return None
    if rule.owner:
        # An owner rule reaches cluster-scoped objects owned by the tenant (nodes, …),
        # which a tenant's own unconditional rules never reach: only the same owner
        # rule, or an unconditional rule in force cluster-wide, covers it.
        candidates = [h for h in held.owner_rules if h.owner_field == rule.owner_field]
        candidates += cluster_wide
    else:
        candidates = list(held.resource_rules)
    return all(
        any(_covers_resource(h, v, g, r, n) for h in candidates)
        for v in verbs
        for g in groups
        for r in resources
        for n in names
    )


def missing_rules(
    held: RulesInForce, rules: Iterable[Rule], cluster_wide: Sequence[ResourceRule] = ()
) -> list[Rule]:
    return [rule for rule in rules if not covered(held, rule, cluster_wide)]


def cluster_wide_rules(engine: PolicyEngine, identity: Identity) -> list[ResourceRule]:
    """The unconditional resource rules bound to `identity` by ClusterRoleBindings."""
    out: list[ResourceRule] = []
    for role_key, _, _ in engine.bound_roles(identity, ["*"]):
        role = engine.policy.roles.get(role_key)
        for rule in role.rules if role is not None else ():
            if rule.resources and not rule.owner:
                out.append(
                    ResourceRule(rule.verbs, rule.api_groups, rule.resources, rule.resource_names)
                )
    return out


def _refusal(what: str, missing: Sequence[Rule], needs: str) -> str:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return (
        f"{what}: attempting to grant RBAC permissions not currently held: "
        f"{rule_text(missing[0])}{more}; {needs}"
    )


def _lifted(
    engine: PolicyEngine,
    identity: Identity,
    verb: str,
    resource: str,
    tenant: str,
    namespace: str,
    name: str,
    rules: Sequence[Rule],
) -> Sequence[Rule]:
    """The rules still to be held after `escalate`/`bind`: none when the verb is granted
    cluster-wide; the owner rules when it is granted only in the tenant (an owner rule
    reaches cluster-scoped objects the tenant owns, which no tenant grant reaches, so a
    tenant's `escalate`/`bind` never writes one it does not hold); all without it."""
    if not may(engine, identity, verb, resource, tenant, namespace, name):
        return rules
    if may(engine, identity, verb, resource, tenant, namespace, name, cluster_wide=True):
        return ()
    return [rule for rule in rules if rule.owner]


def role_write_refusal(engine: PolicyEngine, identity: Identity, role: RoleDef) -> str | None:
    """Why `identity` may not write this Role/TenantRole (None: it may)."""
    resource = RESOURCE_OF_ROLE_KIND[role.kind]
    rules = _lifted(
        engine, identity, "escalate", resource, role.tenant, role.namespace, role.name, role.rules
    )
    if not rules:
        return None
    held = rules_in_force(engine, identity, role.tenant, role.namespace)
    missing = missing_rules(held, rules, cluster_wide_rules(engine, identity))
    if not missing:
        return None
    return _refusal(
        f"{role.kind} {role.name!r}",
        missing,
        f'creating or updating it needs verb "escalate" on {resource}'
        + (" (cluster-wide, for an owner rule)" if missing[0].owner else ""),
    )


def binding_write_refusal(
    engine: PolicyEngine, identity: Identity, binding: ApiBindingDef
) -> str | None:
    """Why `identity` may not write this binding (None: it may)."""
    ref = binding.role
    resource = RESOURCE_OF_ROLE_KIND[ref.kind]
    role = engine.policy.roles.get(binding.role_ref)
    bind = (binding.tenant, binding.namespace, ref.name)
    if role is None:
        if may(engine, identity, "bind", resource, *bind):
            return None
        return (
            f"roleRef: {ref.kind} {ref.name!r} does not exist; binding a role that does "
            f'not exist needs verb "bind" on {resource}'
        )
    rules = _lifted(engine, identity, "bind", resource, *bind, role.rules)
    if not rules:
        return None
    held = rules_in_force(engine, identity, binding.tenant, binding.namespace)
    missing = missing_rules(held, rules, cluster_wide_rules(engine, identity))
    if not missing:
        return None
    return _refusal(
        f"{binding.kind} {binding.name!r} to {ref.kind} {ref.name!r}",
        missing,
        f'binding it needs those rules in the binding\'s scope or verb "bind" on {resource}'
        + (" (cluster-wide, for an owner rule)" if missing[0].owner else ""),
    )

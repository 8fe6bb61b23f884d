"""The decision engine: an index in front of the compiled Casbin model, plus a cache.

Owns `decide(identity, target, obj)`. The compiled model (`compile.py`) is evaluated
with Casbin's own expression evaluator, but only over the policy lines that can apply:
a request in `{t}/{ns}` can only be touched by bindings in the domains `{t}/{ns}`,
`{t}` and `*`, so the caller's roles are resolved from those three exact domain
lookups, and only those roles' lines for the requested resource (plus wildcard lines)
are evaluated. Cost depends on the caller's bindings, never on the policy's size. A
property test checks the result against a plain pycasbin Enforcer.

No threads: the engine is used from the event loop only (Casbin's evaluator keeps
per-call state).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from casbin import util as casbin_util
from casbin.core_enforcer import CoreEnforcer

from sidecar.context import Identity
from sidecar.policy.compile import (
    FUNCTIONS,
    NO_DOMAIN,
    OWNED,
    OWNER_PREFIX,
    Compiled,
    PLine,
    compile_rbac,
    plain_enforcer,
    rule_match,
    split_set,
    tenant_ok,
)
from sidecar.policy.decision import Decision
from sidecar.policy.files import Document, Problem
from sidecar.policy.owner import owner_value
from sidecar.policy.rbac import AUTHENTICATED_GROUP, RbacPolicy, group_key, parse_rbac, user_key
from sidecar.policy.scopes import DEFAULT_OWNER_FIELDS, is_cluster_scoped
from sidecar.target import RequestTarget, Scope, is_dns1123_label

if TYPE_CHECKING:
    import casbin

    from sidecar.metrics import Metrics

RBAC_KINDS = frozenset(
    {
        "ClusterRole",
        "TenantRole",
        "Role",
        "ClusterRoleBinding",
        "TenantRoleBinding",
        "RoleBinding",
    }
)

_R_TOKENS = ("r_sub", "r_nd", "r_td", "r_scope", "r_grp", "r_res", "r_name", "r_act", "r_own")
_P_TOKENS = ("p_sub", "p_kind", "p_grp", "p_res", "p_name", "p_act", "p_cond", "p_id")
_ITEM_VERBS = frozenset({"get", "update", "patch", "delete", "create"})
_LIST_VERBS = frozenset({"list"})
# Writes whose body says who owns the object (subresource bodies are not the object).
_OWNER_BODY_VERBS = frozenset({"create", "update", "patch"})
# The owner behind any other verb is read fresh (DESIGN §5: writes never use a cache).
READ_VERBS = frozenset({"get", "list", "watch"})

Request = tuple[str, str, str, str, str, str, str, str]  # r without sub and own


@dataclass(frozen=True, slots=True)
class Grant:
    """One policy line that matched, and the binding that put it in force."""

    line: PLine
    binding: str  # "TenantRoleBinding acme/devs"
    role: str

    @property
    def rule_id(self) -> str:
        return self.line[7]

    @property
    def owner_field(self) -> str:
        return self.line[6][len(OWNER_PREFIX) :]

    def explain(self) -> str:
        return f"{self.binding} → {self.role} → rule {self.rule_id}"


@dataclass(frozen=True, slots=True)
class Match:
    """What the policy grants a caller on a target before the object is known."""

    unconditional: Grant | None = None
    owner: tuple[Grant, ...] = ()
    invalid: str = ""

    @property
    def owner_only(self) -> bool:
        return self.unconditional is None and bool(self.owner)


@dataclass
class _Role:
    label: str
    # resource (incl. "res/sub") → lines; wildcard resource lines; non-resource lines
    by_resource: dict[str, list[PLine]] = field(default_factory=dict)
    wildcard: list[PLine] = field(default_factory=list)
    urls: list[PLine] = field(default_factory=list)


class PolicyEngine:
    def __init__(
        self, revision: str, policy: RbacPolicy | None = None, compiled: Compiled | None = None
    ) -> None:
        self.revision = revision
        self.policy = policy or RbacPolicy()
        self.compiled = compiled or compile_rbac(self.policy)
        self._roles: dict[str, _Role] = {}
        for role_def in self.policy.roles.values():
            self._roles[role_def.key] = _Role(role_def.label)
        for line in self.compiled.p_lines:
            entry = self._roles[line[0]]
            if line[1] == "url":
                entry.urls.append(line)
                continue
            resources = split_set(line[3])
            if any("*" in r for r in resources):
                entry.wildcard.append(line)
            for r in resources:
                if "*" not in r:
                    entry.by_resource.setdefault(r, []).append(line)
        # (apiGroups, resources, ownerField) of every owner rule, for `owner_fields`.
        self._owner_rules: list[tuple[frozenset[str], frozenset[str], str]] = [
            (
                frozenset(rule.api_groups),
                frozenset(r.partition("/")[0] for r in rule.resources),
                rule.owner_field,
            )
            for role_def in self.policy.roles.values()
            for rule in role_def.rules
            if rule.owner
        ]
        # (domain, subject) → {role: binding label}
        self._links: dict[tuple[str, str], dict[str, str]] = {}
        for link, bindings in self.compiled.link_bindings.items():
            sub, role_key, dom = link
            self._links.setdefault((dom, sub), {}).setdefault(role_key, bindings[0].label)
        functions = dict(FUNCTIONS)
        # A function over the links table, not a bound method: the evaluator must not
        # refer back to the engine, so a retired engine is freed by reference counting
        # alone (the reloader keeps policies out of the cyclic collector's scans).
        functions["g"] = _role_check(self._links)
        matcher = casbin_util.escape_assertion(self._matcher_text())
        self._expr = CoreEnforcer._get_expression(matcher, functions)

    @staticmethod
    def _matcher_text() -> str:
        from sidecar.policy.compile import new_model

        return str(new_model()["m"]["m"].value)

    # -- public API -------------------------------------------------------------

    def rule_ids(self) -> list[str]:
        return self.policy.rule_ids()

    @property
    def line_count(self) -> int:
        return len(self.compiled.p_lines) + len(self.compiled.g_lines)

    def plain_enforcer(self) -> casbin.Enforcer:
        return plain_enforcer(self.compiled)

    def decide(self, identity: Identity, target: RequestTarget, obj: Any = None) -> Decision:
        return self.finish(self.match(identity, target), identity, target, obj)

    def can_reach(self, identity: Identity, target: RequestTarget) -> bool:
        """Whether any binding in force for this caller could grant anything on this
        target's resource (any verb). Only ClusterRoleBindings reach other tenants and
        lists across tenants; a tenant's own bindings reach cluster-scoped objects
        through owner rules (`request_vector` gives them no domain elsewhere)."""
        m = self.match(identity, target, any_verb=True)
        return m.unconditional is not None or bool(m.owner)

    def cluster_wide(self, identity: Identity, target: RequestTarget) -> bool:
        """Whether a grant in force cluster-wide (a ClusterRoleBinding) allows this
        request unconditionally."""
        return self.match(identity, target, domains=("*",)).unconditional is not None

    def owner_fields(self, api_group: str, resource: str) -> tuple[str, ...]:
        """The owner fields objects of this resource carry: those the policy's owner
        rules name for it, plus the built-in `DEFAULT_OWNER_FIELDS`."""
        base = resource.partition("/")[0]
        found: dict[str, None] = {}
        default = DEFAULT_OWNER_FIELDS.get((api_group, base))
        if default:
            found[default] = None
        for groups, resources, owner_field in self._owner_rules:
            if ("*" in groups or api_group in groups) and ("*" in resources or base in resources):
                found[owner_field] = None
        return tuple(found)

    def owner_checks(
        self, match: Match, identity: Identity, target: RequestTarget
    ) -> tuple[str, ...]:
        """The owner fields a write's body must keep to the caller's tenant
        (`owner.enforce_owner`), or () when no such rule applies: only a grant in force
        cluster-wide may set another tenant as owner, on create, update or patch."""
        if (
            not target.resource_request
            or target.verb not in _OWNER_BODY_VERBS
            or target.subresource
        ):
            return ()
        fields = dict.fromkeys(g.owner_field for g in match.owner) if match.owner_only else {}
        fields.update(dict.fromkeys(self.owner_fields(target.api_group, target.resource)))
        if not fields or (match.unconditional is not None and self.cluster_wide(identity, target)):
            return ()
        return tuple(fields)

    def match(
        self,
        identity: Identity,
        target: RequestTarget,
        any_verb: bool = False,
        domains: tuple[str, ...] | None = None,
    ) -> Match:
        """What the policy grants; `domains` limits the bindings looked at (e.g. `("*",)`
        for ClusterRoleBindings only)."""
        req = request_vector(identity, target)
        if isinstance(req, str):
            return Match(invalid=req)
        nd, td, scope, grp, res, name, act = req[1:]
        subjects = subject_keys(identity)
        names: dict[str, str] = dict(zip(_R_TOKENS[1:8], req[1:], strict=True))
        names["r_own"] = OWNED
        owner: list[Grant] = []
        seen: set[tuple[str, str]] = set()
        for dom in domains or (nd, td, "*"):
            if dom == NO_DOMAIN or dom not in (nd, td, "*"):
                continue
            for sub in subjects:
                roles = self._links.get((dom, sub))
                if not roles:
                    continue
                names["r_sub"] = sub
                for role_key, binding in roles.items():
                    if (sub, role_key) in seen:
                        continue
                    seen.add((sub, role_key))
                    role = self._roles[role_key]
                    for line in self._candidate_lines(role, scope, res):
                        if any_verb:
                            line = (*line[:5], "*", *line[6:])
                        # rule_match is a conjunct of the matcher: a cheap pre-check
                        # that spares the expression evaluator most non-matching lines.
                        if not rule_match(scope, grp, res, name, act, *line[1:6]):
                            continue
                        names.update(zip(_P_TOKENS, line, strict=True))
                        if not self._expr.eval(names):
                            continue
                        grant = Grant(
                            line,
                            self._binding_for(sub, role_key, line, nd, td, scope) or binding,
                            role.label,
                        )
                        if not line[6]:
                            return Match(unconditional=grant, owner=tuple(owner))
                        owner.append(grant)
        return Match(owner=tuple(owner))

    @staticmethod
    def _candidate_lines(role: _Role, scope: str, res: str) -> list[PLine]:
        if scope == "url":
            return role.urls
        exact = role.by_resource.get(res)
        if exact is None:
            return role.wildcard
        return exact + role.wildcard if role.wildcard else exact

    def _binding_for(
        self, sub: str, role: str, line: PLine, nd: str, td: str, scope: str
    ) -> str | None:
        """Which binding put this line in force (the narrowest domain that applies)."""
        for dom in (nd, td, "*"):
            roles = self._links.get((dom, sub))
            if roles and role in roles and (dom != td or tenant_ok(scope, line[6])):
                return roles[role]
        return None

    def finish(
        self, match: Match, identity: Identity, target: RequestTarget, obj: Any = None
    ) -> Decision:
        """The decision, given what the policy grants and (for owner rules) the object."""
        rev = self.revision
        if match.invalid:
            return Decision("deny", match.invalid, rev)
        if match.unconditional is not None:
            g = match.unconditional
            return Decision("allow", f"allowed by {g.explain()}", rev, rule_id=g.rule_id)
        if not match.owner:
            return Decision("deny", _deny_reason(identity, target), rev)
        first = match.owner[0]
        verb = target.verb
        if not target.name:
            if verb in _LIST_VERBS or verb == "create":
                what = "listed" if verb != "create" else "created"
                return Decision(
                    "filter",
                    f"only objects owned by tenant {identity.tenant!r} may be {what}: "
                    f"owner rule via {first.explain()}",
                    rev,
                    first.owner_field,
                    first.rule_id,
                )
            return Decision(
                "deny",
                f"{verb} on {target.full_resource} is granted only by an owner rule "
                f"({first.explain()}), which cannot apply to a whole collection",
                rev,
                first.owner_field,
            )
        if verb not in _ITEM_VERBS:
            return Decision("deny", _deny_reason(identity, target), rev)
        if obj is None:
            return Decision(
                "notfound",
                f"{target.full_resource} {target.name!r} is reachable only through an owner "
                "rule and its owner is unknown",
                rev,
                first.owner_field,
            )
        for grant in match.owner:
            if owner_value(obj, grant.owner_field) == identity.tenant:
                return Decision(
                    "allow",
                    f"allowed by owner rule ({grant.owner_field} is {identity.tenant!r}) "
                    f"via {grant.explain()}",
                    rev,
                    grant.owner_field,
                    grant.rule_id,
                )
        return Decision(
            "notfound",
            f"{target.resource} {target.name!r} is not owned by tenant {identity.tenant!r} "
            f"({first.owner_field}) and only owner rules grant {verb} on it",
            rev,
            first.owner_field,
        )


def _deny_reason(identity: Identity, target: RequestTarget) -> str:
    who = f'user "{identity.user}" of tenant "{identity.tenant}"'
    if not target.resource_request:
        return f'{who} cannot {target.verb} path "{target.path}": no rule grants it'
    where = ""
    if target.namespace:
        where = f' in namespace "{target.namespace}" of tenant "{target.tenant}"'
    elif target.tenant and target.scope != Scope.CLUSTER:
        where = f' in tenant "{target.tenant}"'
    elif target.scope == Scope.CLUSTER:
        where = " at the cluster scope"
    group = f' in API group "{target.api_group}"' if target.api_group else ""
    return (
        f'{who} cannot {target.verb} resource "{target.full_resource}"{group}{where}: '
        "no binding grants it"
    )


def subject_keys(identity: Identity) -> list[str]:
    t = identity.tenant
    keys = [user_key(t, identity.user)]
    keys += [group_key(t, g) for g in identity.groups if g != AUTHENTICATED_GROUP]
    keys += [group_key(t, AUTHENTICATED_GROUP), group_key("*", AUTHENTICATED_GROUP)]
    return keys


def request_vector(identity: Identity, target: RequestTarget) -> Request | str:
    """The request vector (without `own`), or a reason why the request matches nothing."""
    if not is_dns1123_label(identity.tenant):
        return f"caller tenant {identity.tenant!r} is not a valid tenant name"
    if not identity.user:
        return "the caller has no user name"
    if not target.resource_request:
        return ("", NO_DOMAIN, NO_DOMAIN, "url", "", target.path.split("?", 1)[0], "", target.verb)
    tenant = target.tenant
    if target.scope == Scope.CLUSTER:
        # A tenant's own bindings reach the cluster level only for cluster-scoped
        # objects (through owner rules); a list of a namespaced or tenant-scoped
        # resource across every tenant is for ClusterRoleBindings alone.
        own = identity.tenant if is_cluster_scoped(target.api_group, target.resource) else NO_DOMAIN
        nd, td = NO_DOMAIN, own
    else:
        if tenant is None:  # a short path not resolved yet
            tenant = target.resolve_tenant(identity.tenant).tenant or identity.tenant
        if not is_dns1123_label(tenant):
            return f"target tenant {tenant!r} is not a valid tenant name"
        td = tenant
        nd = f"{tenant}/{target.namespace}" if target.scope == Scope.NAMESPACE else NO_DOMAIN
    scope = target.scope.value if target.scope else "cluster"
    return ("", nd, td, scope, target.api_group, target.full_resource, target.name, target.verb)


def _role_check(links: dict[tuple[str, str], dict[str, str]]) -> Callable[[str, str, str], bool]:
    """Casbin's `g(sub, role, dom)` over the engine's (domain, subject) → roles table."""

    def g(sub: str, role: str, dom: str) -> bool:
        roles = links.get((dom, sub))
        return roles is not None and role in roles

    return g


def compile_engine(docs: Sequence[Document], revision: str) -> tuple[PolicyEngine, list[Problem]]:
    policy, problems = parse_rbac(docs)
    return PolicyEngine(revision, policy, compile_rbac(policy)), problems


class DecisionCache:
    """Bounded LRU of decisions, keyed by policy revision and every decision input.
    Owner-dependent item decisions are keyed by the owner value too (never the whole
    object), so two objects with the same owner share an entry."""

    def __init__(self, maxsize: int, metrics: Metrics | None = None) -> None:
        self._lru: LRUCache[Hashable, Any] = LRUCache(maxsize=max(1, maxsize))
        self._metrics = metrics

    def _count(self, hit: bool) -> None:
        if self._metrics is not None:
            self._metrics.child(self._metrics.decision_cache, "hit" if hit else "miss").inc()

    @staticmethod
    def key(engine: PolicyEngine, identity: Identity, target: RequestTarget) -> tuple[Any, ...]:
        return (
            engine.revision,
            identity.user,
            identity.tenant,
            tuple(sorted(identity.groups)),
            target.verb,
            target.api_group,
            target.full_resource,
            target.name,
            target.scope,
            target.tenant,
            target.namespace,
            "" if target.resource_request else target.path,
        )

    def match(self, engine: PolicyEngine, identity: Identity, target: RequestTarget) -> Match:
        key = self.key(engine, identity, target)
        found = self._lru.get(key)
        if isinstance(found, Match):
            self._count(True)
            return found
        self._count(False)
        m = engine.match(identity, target)
        self._lru[key] = m
        return m

    def decide(
        self, engine: PolicyEngine, identity: Identity, target: RequestTarget, obj: Any = None
    ) -> Decision:
        return self.finish(engine, self.match(engine, identity, target), identity, target, obj)

    def finish(
        self,
        engine: PolicyEngine,
        m: Match,
        identity: Identity,
        target: RequestTarget,
        obj: Any = None,
    ) -> Decision:
        """`engine.finish`, cached by owner value for owner-dependent item decisions."""
        if not (m.owner_only and target.name and obj is not None):
            return engine.finish(m, identity, target, None if not m.owner_only else obj)
        owners = tuple(owner_value(obj, g.owner_field) for g in m.owner)
        key = (*self.key(engine, identity, target), "owner", owners)
        found = self._lru.get(key)
        if isinstance(found, Decision):
            return found
        decision = engine.finish(m, identity, target, obj)
        self._lru[key] = decision
        return decision

    def __len__(self) -> int:
        return len(self._lru)

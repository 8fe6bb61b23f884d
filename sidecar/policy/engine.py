"""The decision engine: an index in front of the compiled Casbin model, plus a cache.

Owns `match(identity, target)`: what the policy grants a caller on a target before
the object is known (the unconditional grant, or the owner-rule grants). The decision
itself (isolation, owner rules, 404 versus 403) is `decide.py`'s, built on this.

The compiled model (`compile.py`) is evaluated only over the policy lines that can
apply: a request in `{t}/{ns}` can only be touched by bindings in the domains
`{t}/{ns}`, `{t}` and `*`, so the caller's roles are resolved from those three exact
domain lookups, and only those roles' lines for the requested resource (plus wildcard
lines) are evaluated. Cost depends on the caller's bindings, never on the policy's
size. The model's matcher is evaluated in plain Python (`_in_force` and the functions
of `compile.py`), not with Casbin's private expression builder; the property test
`tests/sidecar/policy/test_engine_property.py` checks every answer against a plain pycasbin Enforcer
over the same model and lines, so a change of Casbin that changed the model's
meaning fails there.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope, is_dns1123_label
from sidecar.policy.compile import (
    NO_DOMAIN,
    OWNER_PREFIX,
    Compiled,
    PLine,
    compile_rbac,
    plain_enforcer,
    rule_match,
    split_set,
    tenant_ok,
)
from sidecar.policy.rbac import (
    AUTHENTICATED_GROUP,
    RbacPolicy,
    RoleDef,
    group_key,
    parse_rbac,
    user_key,
)
from sidecar.policy.scopes import DEFAULT_OWNER_FIELDS, is_cluster_scoped
from sidecar.policy.source.files import Document, Problem, collector_paused

if TYPE_CHECKING:
    import casbin


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


# What most unknown callers get: one shared object, so that the decision cache's
# entries for a flood of made-up tenants add no object for the garbage collector.
NO_MATCH = Match()


@dataclass
class _Role:
    label: str
    # resource (incl. "res/sub") → lines; wildcard resource lines; non-resource lines
    by_resource: dict[str, list[PLine]] = field(default_factory=dict)
    wildcard: list[PLine] = field(default_factory=list)
    urls: list[PLine] = field(default_factory=list)


RoleIndex = _Role


class PolicyEngine:
    def __init__(
        self, revision: str, policy: RbacPolicy | None = None, compiled: Compiled | None = None
    ) -> None:
        self.revision = revision
        self.policy = policy or RbacPolicy()
        self.compiled = compiled or compile_rbac(self.policy)
        self._roles: dict[str, _Role] = index_roles(
            self.policy.roles.values(), self.compiled.p_lines
        )
        # (apiGroups, resources, ownerField) of every owner rule, for `owner_fields`.
        self._owner_rules: list[tuple[frozenset[str], frozenset[str], str]] = owner_rule_keys(
            self.policy.roles.values()
        )
        # (domain, subject) → {role: binding label}
        self._links: dict[tuple[str, str], dict[str, str]] = index_links(self.compiled)

    @classmethod
    def assemble(
        cls,
        revision: str,
        policy: RbacPolicy,
        compiled: Compiled,
        roles: dict[str, _Role],
        links: dict[tuple[str, str], dict[str, str]],
        owner_rules: list[tuple[frozenset[str], frozenset[str], str]],
    ) -> PolicyEngine:
        """An engine from parts already indexed (`index_roles`, `index_links`): how
        the API policy source (`sidecar/policy/source/api.py`) joins its per-tenant
        parts to the files' engine without indexing everything again."""
        engine = cls.__new__(cls)
        engine.revision = revision
        engine.policy = policy
        engine.compiled = compiled
        engine._roles = roles
        engine._links = links
        engine._owner_rules = owner_rules
        return engine

    @property
    def role_index(self) -> dict[str, _Role]:
        return self._roles

    @property
    def link_index(self) -> dict[tuple[str, str], dict[str, str]]:
        return self._links

    @property
    def owner_rule_index(self) -> list[tuple[frozenset[str], frozenset[str], str]]:
        return self._owner_rules

    # -- public API -------------------------------------------------------------

    def rule_ids(self) -> list[str]:
        return self.policy.rule_ids()

    @property
    def line_count(self) -> int:
        return len(self.compiled.p_lines) + len(self.compiled.g_lines)

    def plain_enforcer(self) -> casbin.Enforcer:
        return plain_enforcer(self.compiled)

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

    def bound_cluster_wide(self, subject_key: str) -> str:
        """The name of a ClusterRoleBinding that names this subject (`user_key` /
        `group_key`), or "" when none does."""
        links = self._links.get(("*", subject_key))
        return next(iter(links.values()), "") if links else ""

    def bound_roles(self, identity: Identity, domains: Sequence[str]) -> list[tuple[str, str, str]]:
        """(role key, binding label, domain) of every role bound to the caller in these
        domains (`*`, `{tenant}`, `{tenant}/{namespace}`), each role once."""
        found: dict[str, tuple[str, str, str]] = {}
        for dom in domains:
            for sub in subject_keys(identity):
                for role_key, binding in self._links.get((dom, sub), {}).items():
                    found.setdefault(role_key, (role_key, binding, dom))
        return list(found.values())

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
        owner: list[Grant] = []
        seen: set[tuple[str, str]] = set()
        for dom in domains or (nd, td, "*"):
            if dom == NO_DOMAIN or dom not in (nd, td, "*"):
                continue
            for sub in subject_keys(identity):
                roles = self._links.get((dom, sub))
                if not roles:
                    continue
                for role_key, binding in roles.items():
                    if (sub, role_key) in seen:
                        continue
                    seen.add((sub, role_key))
                    role = self._roles[role_key]
                    for line in self._candidate_lines(role, scope, res):
                        verbs = "*" if any_verb else line[5]
                        if not rule_match(scope, grp, res, name, act, *line[1:5], verbs):
                            continue
                        if not self._in_force(sub, role_key, nd, td, scope, line[6], domains):
                            continue
                        grant = Grant(
                            line,
                            self._binding_for(sub, role_key, line, nd, td, scope) or binding,
                            role.label,
                        )
                        if not line[6]:
                            return Match(unconditional=grant, owner=tuple(owner))
                        owner.append(grant)
        return Match(owner=tuple(owner)) if owner else NO_MATCH

    def _in_force(
        self,
        sub: str,
        role: str,
        nd: str,
        td: str,
        scope: str,
        cond: str,
        domains: tuple[str, ...] | None,
    ) -> bool:
        """The model's role clause: `g(sub, role, nd) || (g(sub, role, td) &&
        tenantOk(scope, cond)) || g(sub, role, "*")`, over the domains looked at.
        (`ownerOk` is decided later, by `decide`, once the owner is known.)"""
        allowed = domains or (nd, td, "*")

        def g(dom: str) -> bool:
            roles = self._links.get((dom, sub))
            return dom in allowed and roles is not None and role in roles

        return g(nd) or (g(td) and tenant_ok(scope, cond)) or g("*")

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


def index_roles(role_defs: Iterable[RoleDef], p_lines: Iterable[PLine]) -> dict[str, _Role]:
    """Role key → its lines by resource (the engine's index)."""
    roles: dict[str, _Role] = {}
    for role_def in role_defs:
        roles[role_def.key] = _Role(role_def.label)
    for line in p_lines:
        entry = roles[line[0]]
        if line[1] == "url":
            entry.urls.append(line)
            continue
        by_resource = entry.by_resource
        if "*" in line[3]:  # some resource is "*" or "*/sub"
            entry.wildcard.append(line)
            resources = [r for r in split_set(line[3]) if "*" not in r]
        else:
            resources = line[3].split(",")
        for r in resources:
            lines = by_resource.get(r)
            if lines is None:
                by_resource[r] = [line]
            elif lines[-1] is not line:  # a resource named twice in one rule
                lines.append(line)
    return roles


def owner_rule_keys(
    role_defs: Iterable[RoleDef],
) -> list[tuple[frozenset[str], frozenset[str], str]]:
    return [
        (
            frozenset(rule.api_groups),
            frozenset(r.partition("/")[0] for r in rule.resources),
            rule.owner_field,
        )
        for role_def in role_defs
        for rule in role_def.rules
        if rule.owner
    ]


def index_links(compiled: Compiled) -> dict[tuple[str, str], dict[str, str]]:
    """(domain, subject) → {role key: label of the first binding linking them}."""
    links: dict[tuple[str, str], dict[str, str]] = {}
    labels: dict[int, str] = {}  # id(binding) → its label, computed once per binding
    for link, bindings in compiled.link_bindings.items():
        sub, role_key, dom = link
        first = bindings[0]
        label = labels.get(id(first))
        if label is None:
            label = labels[id(first)] = first.label
        roles_of = links.get((dom, sub))
        if roles_of is None:
            links[(dom, sub)] = {role_key: label}
        elif role_key not in roles_of:
            roles_of[role_key] = label
    return links


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
            tenant = target.tenant_for(identity.tenant)
        if not is_dns1123_label(tenant):
            return f"target tenant {tenant!r} is not a valid tenant name"
        td = tenant
        nd = f"{tenant}/{target.namespace}" if target.scope == Scope.NAMESPACE else NO_DOMAIN
    scope = target.scope.value if target.scope else "cluster"
    return ("", nd, td, scope, target.api_group, target.full_resource, target.name, target.verb)


def compile_engine(docs: Sequence[Document], revision: str) -> tuple[PolicyEngine, list[Problem]]:
    with collector_paused():
        policy, problems = parse_rbac(docs)
        return PolicyEngine(revision, policy, compile_rbac(policy)), problems


class DecisionCache:
    """Bounded LRU of what the policy grants, keyed by policy revision and every
    decision input: the `match` of a request, whether any binding reaches its target
    (`can_reach`), and whether a cluster-wide grant allows it (`cluster_wide`). The
    verdict built from these (`decide.py`) is cheap; these are what cost."""

    def __init__(self, maxsize: int, count: Callable[[bool], None] | None = None) -> None:
        """`count(hit)` is called on every lookup (`Metrics.count_decision_cache`)."""
        self._lru: LRUCache[Hashable, Any] = LRUCache(maxsize=max(1, maxsize))
        self._counter = count

    def _count(self, hit: bool) -> None:
        if self._counter is not None:
            self._counter(hit)

    @staticmethod
    def key(engine: PolicyEngine, identity: Identity, target: RequestTarget) -> tuple[Any, ...]:
        # One flat tuple of strings (the groups last, after the fixed fields): the
        # garbage collector stops tracking it the first time it looks, so a full
        # collection never scans the cache's keys (an enum member or a nested tuple
        # would keep them tracked).
        return (
            engine.revision,
            identity.user,
            identity.tenant,
            target.verb,
            target.api_group,
            target.full_resource,
            target.name,
            "" if target.scope is None else target.scope.value,
            target.tenant,
            target.namespace,
            "" if target.resource_request else target.path,
            *sorted(identity.groups),
        )

    def _get(
        self,
        kind: str,
        engine: PolicyEngine,
        identity: Identity,
        target: RequestTarget,
        compute: Callable[[Identity, RequestTarget], Any],
    ) -> Any:
        key = (kind, *self.key(engine, identity, target))
        try:
            found = self._lru[key]
        except KeyError:
            pass
        else:
            self._count(True)
            return found
        self._count(False)
        value = compute(identity, target)
        self._lru[key] = value
        return value

    def match(self, engine: PolicyEngine, identity: Identity, target: RequestTarget) -> Match:
        found: Match = self._get("match", engine, identity, target, engine.match)
        return found

    def can_reach(self, engine: PolicyEngine, identity: Identity, target: RequestTarget) -> bool:
        return bool(self._get("reach", engine, identity, target, engine.can_reach))

    def cluster_wide(self, engine: PolicyEngine, identity: Identity, target: RequestTarget) -> bool:
        return bool(self._get("cluster", engine, identity, target, engine.cluster_wide))

    def __len__(self) -> int:
        return len(self._lru)

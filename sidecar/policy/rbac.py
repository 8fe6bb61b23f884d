"""The six RBAC kinds (DESIGN §5): loading, validation, and the typed objects they become.

Owns the meaning of `ClusterRole`, `TenantRole`, `Role`, `ClusterRoleBinding`,
`TenantRoleBinding` and `RoleBinding` documents: field sets, verbs, owner rules,
roleRef resolution, tenant-qualified subjects. Every meaning error is a `Problem` with
the file and line of the offending node; a document with errors grants nothing (a
dangling or cross-tenant binding is dropped, a bad rule is skipped). Nothing here
knows about Casbin: `compile.py` turns `RbacPolicy` into a model and policy lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.target import SYSTEM_TENANT, is_dns1123_label
from sidecar.policy.source.files import Document, Node, NodeList, Problem

CLUSTER_ROLE = "ClusterRole"
TENANT_ROLE = "TenantRole"
ROLE = "Role"
CLUSTER_ROLE_BINDING = "ClusterRoleBinding"
TENANT_ROLE_BINDING = "TenantRoleBinding"
ROLE_BINDING = "RoleBinding"
ROLE_KINDS = frozenset({CLUSTER_ROLE, TENANT_ROLE, ROLE})
BINDING_KINDS = frozenset({CLUSTER_ROLE_BINDING, TENANT_ROLE_BINDING, ROLE_BINDING})
RBAC_KINDS = ROLE_KINDS | BINDING_KINDS

# Verbs the request parser can produce (DESIGN §3), `impersonate` (the impersonation
# headers, DESIGN §4), and the wildcard.
RESOURCE_VERBS = frozenset(
    {
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "impersonate",
        "*",
    }
)
NON_RESOURCE_VERBS = frozenset({"get", "head", "post", "put", "patch", "delete", "options", "*"})
# Verbs an owner rule decides for one named object, by the stored object's owner
# (subresources included).
OWNER_ITEM_VERBS = frozenset({"get", "update", "patch", "delete"})
# Verbs an owner rule can decide: items by their stored owner, lists and watches by
# filtering (a watch's events, `sidecar/services/watchfilter.py`), creates by the body's
# owner. A deletecollection cannot be filtered.
OWNER_VERBS = OWNER_ITEM_VERBS | {"list", "watch", "create", "*"}
SUBJECT_KINDS = frozenset({"User", "Group", "ServiceAccount"})
AUTHENTICATED_GROUP = "system:authenticated"
DEFAULT_OWNER_FIELD = "spec.owner"

_DOC_FIELDS = {
    "role": frozenset({"apiVersion", "kind", "metadata", "rules"}),
    "binding": frozenset({"apiVersion", "kind", "metadata", "roleRef", "subjects"}),
}
_META_FIELDS = frozenset({"name", "tenant", "namespace", "labels", "annotations"})
_RULE_FIELDS = frozenset(
    {"apiGroups", "resources", "resourceNames", "verbs", "nonResourceURLs", "when", "ownerField"}
)
_ROLEREF_FIELDS = frozenset({"apiGroup", "kind", "name", "tenant", "namespace"})
_SUBJECT_FIELDS = frozenset({"kind", "name", "tenant", "namespace", "apiGroup"})
_OWNER_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")
# Characters that would make a compiled policy value ambiguous.
_FORBIDDEN_IN_VALUES = (",", "\n", "\r")
_FORBIDDEN_RE = re.compile(r"[,\n\r]")
# What `_plain_resource_rule` accepts without the full check: no wildcard, no
# subresource in resources; no wildcard in resourceNames.
_PLAIN_RULE_FIELDS = frozenset({"apiGroups", "resources", "resourceNames", "verbs"})
_NOT_PLAIN_RESOURCES = re.compile(r"[,\n\r*/]")
_NOT_PLAIN_NAMES = re.compile(r"[,\n\r*]")
_PLAIN_SUBJECT_FIELDS = frozenset({"kind", "name"})
_ALLOWED_REFS = {
    CLUSTER_ROLE_BINDING: (CLUSTER_ROLE,),
    TENANT_ROLE_BINDING: (TENANT_ROLE, CLUSTER_ROLE),
    ROLE_BINDING: (ROLE, TENANT_ROLE, CLUSTER_ROLE),
}


@dataclass(frozen=True, slots=True)
class Rule:
    """One `rules:` entry. Exactly one of resources / non_resource_urls is non-empty
    (a Kubernetes rule that names both is split into two `Rule`s with the same id)."""

    rule_id: str  # "file:line" of the rule entry: stable, used for coverage
    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    owner: bool = False
    owner_field: str = DEFAULT_OWNER_FIELD


@dataclass(frozen=True, slots=True)
class RoleDef:
    kind: str
    name: str
    tenant: str = ""
    namespace: str = ""
    rules: tuple[Rule, ...] = ()
    file: str = ""
    line: int = 0

    @property
    def key(self) -> str:
        return role_key(self.kind, self.name, self.tenant, self.namespace)

    @property
    def label(self) -> str:
        return f"{self.kind} {_scoped(self.name, self.tenant, self.namespace)}"


@dataclass(frozen=True, slots=True)
class Subject:
    kind: str
    name: str
    tenant: str
    namespace: str = ""

    @property
    def key(self) -> str:
        """Tenant-qualified subject key; `name` may contain ':' but a tenant cannot."""
        if self.kind == "Group":
            return group_key(self.tenant, self.name)
        if self.kind == "ServiceAccount":
            return user_key(self.tenant, f"system:serviceaccount:{self.namespace}:{self.name}")
        return user_key(self.tenant, self.name)


@dataclass(frozen=True, slots=True)
class BindingDef:
    kind: str
    name: str
    tenant: str
    namespace: str
    role: RoleDef
    subjects: tuple[Subject, ...]
    file: str = ""
    line: int = 0

    @property
    def domain(self) -> str:
        """Where the binding is in force: `*`, `{tenant}` or `{tenant}/{namespace}`."""
        if self.kind == CLUSTER_ROLE_BINDING:
            return "*"
        if self.kind == TENANT_ROLE_BINDING:
            return self.tenant
        return f"{self.tenant}/{self.namespace}"

    @property
    def label(self) -> str:
        return f"{self.kind} {_scoped(self.name, self.tenant, self.namespace)}"


@dataclass(frozen=True, slots=True)
class RbacPolicy:
    roles: dict[str, RoleDef] = field(default_factory=dict)
    bindings: tuple[BindingDef, ...] = ()

    def rule_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for role in self.roles.values():
            for rule in role.rules:
                seen[rule.rule_id] = None
        return list(seen)


def owner_rule_decides(verb: str, name: str) -> bool:
    """Whether an owner rule can decide a request: a list or a watch (filtered by
    owner), a create
    of an unnamed object (by its body's owner), or one named object (by its stored
    owner, `OWNER_ITEM_VERBS`). Anything else it grants cannot be decided by owner."""
    return (
        verb in ("list", "watch")
        or (verb == "create" and not name)
        or (bool(name) and verb in OWNER_ITEM_VERBS)
    )


def role_key(kind: str, name: str, tenant: str = "", namespace: str = "") -> str:
    if kind == CLUSTER_ROLE:
        return f"cr:{name}"
    if kind == TENANT_ROLE:
        return f"tr:{tenant}:{name}"
    return f"r:{tenant}:{namespace}:{name}"


def user_key(tenant: str, name: str) -> str:
    return f"u:{tenant}:{name}"


def group_key(tenant: str, name: str) -> str:
    return f"g:{tenant}:{name}"


def _scoped(name: str, tenant: str, namespace: str) -> str:
    return "/".join(p for p in (tenant, namespace, name) if p)


class _Checker:
    """Collects problems while reading one document."""

    def __init__(self, doc: Document, problems: list[Problem]) -> None:
        self.doc = doc
        self.problems = problems
        self.ok = True

    def error(self, message: str, node: Any = None, key: str | int | None = None) -> None:
        self.problems.append(self.doc.problem(message, node, key))
        self.ok = False

    def unknown_fields(self, node: Node, allowed: frozenset[str], where: str) -> None:
        for key in node:
            if key not in allowed:
                self.error(f"unknown field {key!r} in {where}", node, key)

    def string_list(
        self, node: Node, key: str, *, required: bool, where: str
    ) -> tuple[str, ...] | None:
        value = node.get(key)
        if value is None:
            if required:
                self.error(f"{where} needs {key!r}", node)
            return None
        try:
            # str.join refuses anything but strings: one C call checks every entry.
            text = "".join(value) if isinstance(value, list) else None
        except TypeError:
            text = None
        if text is None:
            self.error(f"{key!r} in {where} must be a list of strings", node, key)
            return None
        if _FORBIDDEN_RE.search(text):
            for i, v in enumerate(value):
                if any(c in v for c in _FORBIDDEN_IN_VALUES):
                    self.error(f"{key!r} entry {v!r} contains ',' or a line break", value, i)
                    return None
        return tuple(value)


def parse_rbac(docs: Sequence[Document]) -> tuple[RbacPolicy, list[Problem]]:
    """Validate the RBAC documents and resolve bindings to their roles."""
    problems: list[Problem] = []
    roles: dict[str, RoleDef] = {}
    first_seen: dict[tuple[str, str], Document] = {}
    binding_docs: list[Document] = []
    for doc in docs:
        if doc.kind not in RBAC_KINDS:
            continue
        ident = _identity_key(doc)
        if ident is not None:
            prev = first_seen.get(ident)
            if prev is not None:
                problems.append(
                    doc.problem(
                        f"duplicate {doc.kind} {ident[1]!r} (first defined at "
                        f"{prev.file}:{prev.line}); this one is ignored",
                        doc.body.get("metadata"),
                        "name",
                    )
                )
                continue
            first_seen[ident] = doc
        if doc.kind in ROLE_KINDS:
            role = _parse_role(doc, problems)
            if role is not None:
                roles[role.key] = role
        else:
            binding_docs.append(doc)
    bindings = []
    for doc in binding_docs:
        binding = _parse_binding(doc, roles, problems)
        if binding is not None:
            bindings.append(binding)
    return RbacPolicy(roles, tuple(bindings)), problems


def _identity_key(doc: Document) -> tuple[str, str] | None:
    meta = doc.body.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    parts = [meta.get("tenant"), meta.get("namespace"), meta.get("name")]
    return doc.kind, "/".join(p for p in parts if isinstance(p, str) and p)


def _metadata(c: _Checker, kind: str) -> tuple[str, str, str] | None:
    """(name, tenant, namespace) with the fields this kind needs, or None."""
    body = c.doc.body
    meta = body.get("metadata")
    if not isinstance(meta, Node):
        c.error(f"{kind} needs a 'metadata' mapping", body, "metadata" if meta else None)
        return None
    c.unknown_fields(meta, _META_FIELDS, "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        c.error(f"{kind} needs metadata.name", meta, "name")
        return None
    needs_tenant = kind not in (CLUSTER_ROLE, CLUSTER_ROLE_BINDING)
    needs_ns = kind in (ROLE, ROLE_BINDING)
    tenant = _scope_field(c, meta, "tenant", needs_tenant, kind)
    namespace = _scope_field(c, meta, "namespace", needs_ns, kind)
    if tenant is None or namespace is None:
        return None
    return name, tenant, namespace


def _scope_field(c: _Checker, meta: Node, key: str, needed: bool, kind: str) -> str | None:
    value = meta.get(key)
    if not needed:
        if value is not None:
            c.error(
                f"{kind} is not {'tenant' if key == 'tenant' else 'namespace'}-scoped: "
                f"metadata.{key} is not allowed",
                meta,
                key,
            )
            return None
        return ""
    if not isinstance(value, str) or not value:
        c.error(f"{kind} needs metadata.{key}", meta, key if value is not None else None)
        return None
    if not is_dns1123_label(value):
        c.error(f"metadata.{key} {value!r} is not a valid {key} name (DNS-1123 label)", meta, key)
        return None
    return value


def _parse_role(doc: Document, problems: list[Problem]) -> RoleDef | None:
    c = _Checker(doc, problems)
    c.unknown_fields(doc.body, _DOC_FIELDS["role"], doc.kind)
    meta = _metadata(c, doc.kind)
    if meta is None:
        return None
    name, tenant, namespace = meta
    raw_rules = doc.body.get("rules")
    rules: list[Rule] = []
    if raw_rules is None:
        raw_rules = []
    if not isinstance(raw_rules, list):
        c.error("'rules' must be a list", doc.body, "rules")
        raw_rules = []
    for i, raw in enumerate(raw_rules):
        line = raw_rules.line_of(i) if isinstance(raw_rules, NodeList) else doc.line
        rules.extend(_parse_rule(c, raw, f"{doc.file}:{line}", doc.kind, raw_rules, i))
    return RoleDef(doc.kind, name, tenant, namespace, tuple(rules), doc.file, doc.line)


def _parse_rule(
    c: _Checker, raw: Any, rule_id: str, kind: str, parent: Any, index: int
) -> list[Rule]:
    plain = _plain_resource_rule(raw, rule_id)
    if plain is not None:
        return [plain]
    return _checked_rule(c, raw, rule_id, kind, parent, index)


def _plain_resource_rule(raw: Any, rule_id: str) -> Rule | None:
    """The common rule, when it has no problem: apiGroups, resources and known verbs
    (maybe resourceNames), no wildcard or subresource in resources, no owner, no URLs.
    Anything else (None) goes through `_checked_rule`, which finds every problem; this
    accepts only what that accepts, and builds the same `Rule`."""
    if type(raw) is not Node or not raw.keys() <= _PLAIN_RULE_FIELDS:
        return None
    verbs = raw.get("verbs")
    groups = raw.get("apiGroups")
    resources = raw.get("resources")
    names = raw.get("resourceNames", ())
    if not (
        type(verbs) is NodeList
        and type(groups) is NodeList
        and type(resources) is NodeList
        and (type(names) is NodeList or names == ())
        and verbs
        and groups
        and resources
        and "" not in resources
        and "" not in names
    ):
        return None
    try:
        if (
            not RESOURCE_VERBS.issuperset(verbs)
            or _FORBIDDEN_RE.search("".join(groups))
            or _NOT_PLAIN_RESOURCES.search("".join(resources))
            or _NOT_PLAIN_NAMES.search("".join(names))
        ):
            return None
    except TypeError:  # an entry that is not a string
        return None
    return Rule(rule_id, tuple(verbs), tuple(groups), tuple(resources), tuple(names))


def _checked_rule(
    c: _Checker, raw: Any, rule_id: str, kind: str, parent: Any, index: int
) -> list[Rule]:
    """Every check of a rule, each problem reported with its line."""
    if not isinstance(raw, Node):
        c.error("a rule must be a mapping", parent, index)
        return []
    before = len(c.problems)
    c.unknown_fields(raw, _RULE_FIELDS, "rule")
    verbs = c.string_list(raw, "verbs", required=True, where="a rule")
    groups = c.string_list(raw, "apiGroups", required=False, where="a rule")
    resources = c.string_list(raw, "resources", required=False, where="a rule")
    names = c.string_list(raw, "resourceNames", required=False, where="a rule")
    urls = c.string_list(raw, "nonResourceURLs", required=False, where="a rule")
    when = raw.get("when")
    owner = False
    if when is not None:
        if when != "owner":
            c.error(f"'when' must be 'owner', not {when!r}", raw, "when")
        owner = True
    owner_field = raw.get("ownerField", DEFAULT_OWNER_FIELD)
    if "ownerField" in raw:
        if not owner:
            c.error("'ownerField' needs 'when: owner'", raw, "ownerField")
        if not isinstance(owner_field, str) or not _OWNER_FIELD_RE.match(owner_field):
            c.error(
                f"'ownerField' must be a dotted field path like spec.owner, not {owner_field!r}",
                raw,
                "ownerField",
            )
            owner_field = DEFAULT_OWNER_FIELD
    if verbs is not None and not verbs:
        c.error("'verbs' is empty: the rule grants nothing", raw, "verbs")
    if resources is None and urls is None:
        c.error("a rule needs 'resources' or 'nonResourceURLs'", raw)
    if resources is not None:
        if groups is None:
            c.error("a resource rule needs 'apiGroups' (use [\"\"] for the core group)", raw)
        elif not groups:
            c.error("'apiGroups' is empty: the rule matches nothing", raw, "apiGroups")
        if not resources:
            c.error("'resources' is empty: the rule matches nothing", raw, "resources")
        for i, r in enumerate(resources):
            if not r or (("*" in r) and r != "*" and not (r.startswith("*/") and "*" not in r[2:])):
                c.error(
                    f"resource {r!r}: '*' may only stand alone or as '*/subresource'",
                    raw["resources"],
                    i,
                )
            elif r.count("/") > 1:
                c.error(f"resource {r!r} has more than one '/'", raw["resources"], i)
        if verbs:
            for i, v in enumerate(verbs):
                if v not in RESOURCE_VERBS:
                    c.error(
                        f"unknown verb {v!r} (one of {', '.join(sorted(RESOURCE_VERBS))})",
                        raw["verbs"],
                        i,
                    )
                elif owner and v not in OWNER_VERBS:
                    c.error(
                        f"'when: owner' has no meaning for verb {v!r} "
                        "(deletecollection cannot be filtered by owner)",
                        raw["verbs"],
                        i,
                    )
    elif groups is not None or names is not None:
        c.error("'apiGroups'/'resourceNames' need 'resources'", raw)
    if names is not None:
        for i, n in enumerate(names):
            if not n or "*" in n:
                c.error(
                    f"resourceNames entry {n!r}: names are literal, '*' is not a wildcard",
                    raw["resourceNames"],
                    i,
                )
    if urls is not None:
        if kind != CLUSTER_ROLE:
            c.error("'nonResourceURLs' are only allowed in a ClusterRole", raw, "nonResourceURLs")
        if owner:
            c.error("'when: owner' has no meaning for nonResourceURLs", raw, "when")
        for i, u in enumerate(urls):
            if u != "*" and (not u.startswith("/") or "*" in u[:-1]):
                c.error(
                    f"nonResourceURL {u!r} must start with '/' and may only end in '*'",
                    raw["nonResourceURLs"],
                    i,
                )
        if verbs:
            for i, v in enumerate(verbs):
                if v not in NON_RESOURCE_VERBS:
                    c.error(
                        f"unknown verb {v!r} for nonResourceURLs (one of "
                        f"{', '.join(sorted(NON_RESOURCE_VERBS))})",
                        raw["verbs"],
                        i,
                    )
    if len(c.problems) > before or not verbs:
        return []
    out = []
    if resources:
        out.append(
            Rule(
                rule_id,
                verbs,
                groups or (),
                resources,
                names or (),
                (),
                owner,
                owner_field if isinstance(owner_field, str) else DEFAULT_OWNER_FIELD,
            )
        )
    if urls:
        out.append(Rule(rule_id, verbs, non_resource_urls=urls))
    return out


def _parse_binding(
    doc: Document, roles: dict[str, RoleDef], problems: list[Problem]
) -> BindingDef | None:
    c = _Checker(doc, problems)
    body = doc.body
    c.unknown_fields(body, _DOC_FIELDS["binding"], doc.kind)
    meta = _metadata(c, doc.kind)
    role = _role_ref(c, meta, roles)
    subjects = _subjects(c, meta)
    if meta is None or role is None or subjects is None or not c.ok:
        return None
    name, tenant, namespace = meta
    return BindingDef(doc.kind, name, tenant, namespace, role, subjects, doc.file, doc.line)


def _role_ref(
    c: _Checker, meta: tuple[str, str, str] | None, roles: dict[str, RoleDef]
) -> RoleDef | None:
    body = c.doc.body
    ref = body.get("roleRef")
    if not isinstance(ref, Node):
        c.error(f"{c.doc.kind} needs a 'roleRef' mapping", body, "roleRef" if ref else None)
        return None
    c.unknown_fields(ref, _ROLEREF_FIELDS, "roleRef")
    kind, name = ref.get("kind"), ref.get("name")
    allowed = _ALLOWED_REFS[c.doc.kind]
    if kind not in allowed:
        c.error(f"a {c.doc.kind} may reference {' or '.join(allowed)}, not {kind!r}", ref, "kind")
        return None
    if not isinstance(name, str) or not name:
        c.error("roleRef needs 'name'", ref, "name")
        return None
    if meta is None:
        return None
    _, tenant, namespace = meta
    for key, own in (("tenant", tenant), ("namespace", namespace)):
        value = ref.get(key)
        if value is not None and value != own:
            c.error(
                f"roleRef names a {kind} of another {key} ({value!r}); a binding can "
                f"only reference roles of its own {key}",
                ref,
                key,
            )
            return None
    key = role_key(str(kind), name, tenant, namespace)
    role = roles.get(key)
    if role is None:
        where = {
            CLUSTER_ROLE: "",
            TENANT_ROLE: f" in tenant {tenant!r}",
            ROLE: f" in {tenant}/{namespace}",
        }[str(kind)]
        c.error(
            f"roleRef: {kind} {name!r} does not exist{where}; the binding grants nothing",
            ref,
            "name",
        )
        return None
    return role


def _subjects(c: _Checker, meta: tuple[str, str, str] | None) -> tuple[Subject, ...] | None:
    body = c.doc.body
    raw = body.get("subjects")
    if not isinstance(raw, NodeList) or not raw:
        c.error(
            f"{c.doc.kind} needs a non-empty 'subjects' list",
            body,
            "subjects" if raw is not None else None,
        )
        return None
    if meta is None:
        return None
    _, tenant, namespace = meta
    cluster = c.doc.kind == CLUSTER_ROLE_BINDING
    # A subject with only kind and name gets this tenant: when that is valid, a User
    # or Group with an ordinary name needs none of the checks below.
    default_tenant = SYSTEM_TENANT if cluster else tenant
    plain_ok = is_dns1123_label(default_tenant)
    reserved_ok = default_tenant == SYSTEM_TENANT
    out: list[Subject] = []
    for i, s in enumerate(raw):
        if plain_ok and type(s) is Node and s.keys() <= _PLAIN_SUBJECT_FIELDS:
            kind, name = s.get("kind"), s.get("name")
            if (
                (kind == "User" or kind == "Group")
                and type(name) is str
                and name
                and name != "*"
                and name != AUTHENTICATED_GROUP
                and (reserved_ok or not name.startswith("system:"))
            ):
                out.append(Subject(kind, name, default_tenant))
                continue
        if not isinstance(s, Node):
            c.error("a subject must be a mapping", raw, i)
            continue
        c.unknown_fields(s, _SUBJECT_FIELDS, "subject")
        kind, name = s.get("kind"), s.get("name")
        if kind not in SUBJECT_KINDS:
            c.error(f"subject kind must be User, Group or ServiceAccount, not {kind!r}", s, "kind")
            continue
        if not isinstance(name, str) or not name:
            c.error("a subject needs 'name'", s, "name")
            continue
        if kind == "User" and name == "*":
            c.error(
                "a User subject named '*' matches no one (there are no wildcard subjects)",
                s,
                "name",
            )
            continue
        sub_tenant = s.get("tenant")
        if kind == "Group" and name == AUTHENTICATED_GROUP:
            if sub_tenant is not None:
                c.error(
                    f"group {AUTHENTICATED_GROUP!r} takes no tenant: in a ClusterRoleBinding "
                    "it matches every tenant, elsewhere the binding's own",
                    s,
                    "tenant",
                )
                continue
            out.append(Subject("Group", name, "*" if cluster else tenant))
            continue
        if sub_tenant is None:
            sub_tenant = SYSTEM_TENANT if cluster else tenant
        if not isinstance(sub_tenant, str) or not is_dns1123_label(sub_tenant):
            c.error(f"subject tenant {sub_tenant!r} is not a valid tenant name", s, "tenant")
            continue
        if not cluster and sub_tenant != tenant:
            c.error(
                f"{c.doc.kind} in tenant {tenant!r} names a subject of tenant "
                f"{sub_tenant!r}; only ClusterRoleBindings grant across tenants",
                s,
                "tenant",
            )
            continue
        if name.startswith("system:") and kind != "ServiceAccount" and sub_tenant != SYSTEM_TENANT:
            c.error(f"subject names starting with 'system:' are reserved ({name!r})", s, "name")
            continue
        sa_ns = s.get("namespace")
        if sa_ns is not None and kind != "ServiceAccount":
            c.error("only a ServiceAccount subject takes 'namespace'", s, "namespace")
            continue
        if kind == "ServiceAccount":
            sa_ns = sa_ns if sa_ns is not None else (namespace or "default")
            if not isinstance(sa_ns, str) or not is_dns1123_label(sa_ns):
                c.error(
                    f"ServiceAccount namespace {sa_ns!r} is not a valid namespace name",
                    s,
                    "namespace",
                )
                continue
            out.append(Subject(kind, name, sub_tenant, sa_ns))
        else:
            out.append(Subject(str(kind), name, sub_tenant))
    return tuple(out)

"""The second policy source: RBAC objects and namespace quotas stored through the API.

DESIGN §5 "Policy objects through the API": Role, RoleBinding, TenantRole and
TenantRoleBinding objects (`rbac.authorization.k8s.io/v1`) and namespace
ResourceQuotas (core `v1`) stored in the backing store are compiled by the same code
as the policy files (`rbac.py`, `compile.py`, `engine.py`) into the one policy
`decide()` reads: the union of both sources' grants.

This module is pure (no I/O): the follower (`sidecar/services/apipolicy.py`) feeds it
the store's objects, the write guard (`sidecar/pipeline/rbacguard.py`) and the offline
tools use its validation.

- An API object becomes a policy `Document` whose "file" is its origin (`rolebinding
  acme/dev/bob-reads`) and whose "lines" are field paths (`rules[0].verbs[1]`), so the
  files' validator names the field of every problem (422 causes, `/readyz` notes).
- Objects are compiled per tenant (`TenantUnit`): a change to one tenant's objects
  compiles that tenant only; `compose` then joins the files' engine and every
  tenant's parts (dict merges, no parsing) into one `PolicyEngine`.
- A binding whose role does not exist (yet) grants nothing and is not an error (as in
  Kubernetes); it takes effect when the role appears. An API role named like a
  policy-file role of the same scope is skipped (the files' role stands).
- A namespace ResourceQuota is a namespace limit (§7): the lowest of the files' limit
  and every API ResourceQuota of that namespace, per resource. It never raises a
  tenant's limit (the tenant quota is checked on its own).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.quantities import exact_units
from sidecar.core.target import is_dns1123_label
from sidecar.policy.compile import Compiled, GLine, PLine, compile_rbac
from sidecar.policy.engine import (
    PolicyEngine,
    RoleIndex,
    index_roles,
    owner_rule_keys,
)
from sidecar.policy.kinds.quotas import QuotaPolicy, limit_error
from sidecar.policy.rbac import (
    ROLE,
    ROLE_BINDING,
    TENANT_ROLE,
    TENANT_ROLE_BINDING,
    BindingDef,
    RbacPolicy,
    RoleDef,
    Rule,
    parse_binding,
    parse_role,
    role_key,
)
from sidecar.policy.source.bundle import PolicyBundle
from sidecar.policy.source.files import Document, Node, NodeList, Problem, collector_paused

RBAC_GROUP = "rbac.authorization.k8s.io"
QUOTA_KIND = "ResourceQuota"
# (API group, resource) → kind, for every kind this source follows.
KINDS: dict[tuple[str, str], str] = {
    (RBAC_GROUP, "roles"): ROLE,
    (RBAC_GROUP, "rolebindings"): ROLE_BINDING,
    (RBAC_GROUP, "tenantroles"): TENANT_ROLE,
    (RBAC_GROUP, "tenantrolebindings"): TENANT_ROLE_BINDING,
    ("", "resourcequotas"): QUOTA_KIND,
}
RESOURCE_OF_KIND = {kind: resource for (_, resource), kind in KINDS.items()}
NAMESPACED = frozenset({ROLE, ROLE_BINDING, QUOTA_KIND})
ROLE_KINDS = frozenset({ROLE, TENANT_ROLE})
BINDING_KINDS = frozenset({ROLE_BINDING, TENANT_ROLE_BINDING})
# The metadata the validator reads; the rest (uid, resourceVersion, …) is the store's.
_KEPT_METADATA = ("name", "labels", "annotations")

_COMPUTE = frozenset({"requests.cpu", "requests.memory"})
_ALIASES = {"cpu": "requests.cpu", "memory": "requests.memory"}
ObjectKey = tuple[str, str, str, str]  # (kind, tenant, namespace, name)
Cause = tuple[str, str]  # (field path, message)


def kind_of(api_group: str, resource: str) -> str | None:
    return KINDS.get((api_group, resource))


def origin(kind: str, tenant: str, namespace: str, name: str) -> str:
    """How a grant names an API object: `rolebinding acme/dev/bob-reads`."""
    return f"{kind.lower()} {'/'.join(p for p in (tenant, namespace, name) if p)}"


# -- API objects as policy documents -----------------------------------------------


class _Paths:
    """Synthetic "line numbers" standing for field paths."""

    def __init__(self) -> None:
        self.paths: list[str] = ["", ""]  # line 1 is the object itself

    def line(self, path: str) -> int:
        self.paths.append(path)
        return len(self.paths) - 1

    def path(self, line: int) -> str:
        return self.paths[line] if 0 < line < len(self.paths) else ""


def _node(value: Any, path: str, paths: _Paths, line: int) -> Any:
    if isinstance(value, dict):
        out = Node()
        out.line = line
        out.key_lines = {}
        for key, item in value.items():
            key = str(key)
            sub = f"{path}.{key}" if path else key
            key_line = paths.line(sub)
            out[key] = _node(item, sub, paths, key_line)
            out.key_lines[key] = key_line
        return out
    if isinstance(value, list):
        items = NodeList()
        items.line = line
        items.item_lines = []
        for i, item in enumerate(value):
            sub = f"{path}[{i}]"
            item_line = paths.line(sub)
            items.append(_node(item, sub, paths, item_line))
            items.item_lines.append(item_line)
        return items
    return value


def to_document(
    kind: str, obj: Mapping[str, Any], tenant: str, namespace: str
) -> tuple[Document, _Paths]:
    """The object as the policy document the files' validator reads: metadata cut to
    what a policy document has (name, labels, annotations), with the tenant and
    namespace the object lives in (from the store or the URL, never the body)."""
    meta = obj.get("metadata")
    kept: dict[str, Any] = {}
    if isinstance(meta, Mapping):
        kept = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    kept["tenant"] = tenant
    if kind in NAMESPACED:
        kept["namespace"] = namespace
    # `status` is the store's (its status subresource), never part of a policy object.
    body = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    body["kind"] = kind
    body["metadata"] = kept
    if kind in ROLE_KINDS and body.get("rules") is None:
        body.pop("rules", None)  # a role without rules grants nothing: valid
    paths = _Paths()
    node = _node(body, "", paths, 1)
    name = kept.get("name")
    label = origin(kind, tenant, namespace, name if isinstance(name, str) else "")
    return Document(kind, node, label, 1), paths


def causes(problems: Iterable[Problem], paths: _Paths) -> list[Cause]:
    return [(paths.path(p.line) or "metadata", p.message) for p in problems]


class _AnyRole(Mapping[str, RoleDef]):
    """Roles for validating a binding alone: every roleRef resolves (to an empty role
    of the referenced key), so only the binding's own fields are judged."""

    def __getitem__(self, key: str) -> RoleDef:
        kind, _, rest = key.partition(":")
        if kind == "cr":
            return RoleDef("ClusterRole", rest)
        if kind == "tr":
            tenant, _, name = rest.partition(":")
            return RoleDef(TENANT_ROLE, name, tenant)
        tenant, _, rest = rest.partition(":")
        namespace, _, name = rest.partition(":")
        return RoleDef(ROLE, name, tenant, namespace)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_ANY_ROLE = _AnyRole()


@dataclass(frozen=True, slots=True)
class ApiRoleDef(RoleDef):
    """A role from the API: labelled by its origin."""

    @property
    def label(self) -> str:
        return origin(self.kind, self.tenant, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class ApiBindingDef(BindingDef):
    """A binding from the API: labelled by its origin (`rolebinding acme/dev/x`)."""

    role_ref: str = ""  # the referenced role's key

    @property
    def label(self) -> str:
        return origin(self.kind, self.tenant, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Checked:
    """One API object read: what it compiles to, or why it is refused."""

    kind: str
    role: ApiRoleDef | None = None
    binding: ApiBindingDef | None = None
    limits: Mapping[str, int] | None = None
    problems: tuple[Cause, ...] = ()


def check_object(kind: str, obj: Any, tenant: str, namespace: str) -> Checked:
    """Validate one object with the files' rules (unknown verbs and fields, malformed
    rules, subjects of another tenant, a roleRef of the wrong scope …); causes name
    the field."""
    if not isinstance(obj, Mapping):
        return Checked(kind, problems=(("", "the object must be a JSON object"),))
    if not is_dns1123_label(tenant) or (kind in NAMESPACED and not is_dns1123_label(namespace)):
        return Checked(kind, problems=(("metadata", "not in a valid tenant or namespace"),))
    if kind == QUOTA_KIND:
        return _check_quota(obj)
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return Checked(kind, problems=(("metadata", "metadata must be an object"),))
    doc, paths = to_document(kind, obj, tenant, namespace)
    problems: list[Problem] = []
    if kind in ROLE_KINDS:
        role = parse_role(doc, problems)
        if problems or role is None:
            return Checked(kind, problems=tuple(causes(problems, paths)) or (("", "invalid"),))
        rules = tuple(
            dataclasses.replace(rule, rule_id=f"{doc.file} {paths.path(_line(rule.rule_id))}")
            for rule in role.rules
        )
        api_role = ApiRoleDef(role.kind, role.name, role.tenant, role.namespace, rules, doc.file, 0)
        return Checked(kind, role=api_role)
    binding = parse_binding(doc, _ANY_ROLE, problems)
    if problems or binding is None:
        return Checked(kind, problems=tuple(causes(problems, paths)) or (("", "invalid"),))
    api_binding = ApiBindingDef(
        binding.kind,
        binding.name,
        binding.tenant,
        binding.namespace,
        binding.role,
        binding.subjects,
        doc.file,
        0,
        binding.role.key,
    )
    return Checked(kind, binding=api_binding)


def _line(rule_id: str) -> int:
    tail = rule_id.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _check_quota(obj: Mapping[str, Any]) -> Checked:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return Checked(QUOTA_KIND, problems=(("spec", "a ResourceQuota needs spec.hard"),))
    hard = spec.get("hard")
    if hard is None:
        return Checked(QUOTA_KIND, limits={})
    if not isinstance(hard, Mapping):
        return Checked(
            QUOTA_KIND, problems=(("spec.hard", "spec.hard must map resources to limits"),)
        )
    limits: dict[str, int] = {}
    problems: list[Cause] = []
    for field_name, value in hard.items():
        # Kubernetes' `cpu` and `memory` in a quota are `requests.cpu`/`requests.memory`.
        res = _ALIASES.get(str(field_name), str(field_name))
        if isinstance(value, str) and value.isdigit() and res not in _COMPUTE:
            value = int(value)  # Kubernetes writes every quantity as a string
        error = limit_error(res, value)
        if error:
            problems.append((f"spec.hard.{field_name}", error))
            continue
        units = exact_units(res, value)
        limits[res] = min(units, limits.get(res, units))
    if problems:
        return Checked(QUOTA_KIND, problems=tuple(problems))
    return Checked(QUOTA_KIND, limits=limits)


# -- per-tenant compilation ----------------------------------------------------------


@dataclass(frozen=True)
class StoredObject:
    kind: str
    tenant: str
    namespace: str
    name: str
    body: Mapping[str, Any]
    resource_version: str = ""

    @property
    def key(self) -> ObjectKey:
        return (self.kind, self.tenant, self.namespace, self.name)

    @property
    def origin(self) -> str:
        return origin(self.kind, self.tenant, self.namespace, self.name)


@dataclass
class TenantUnit:
    """One tenant's API objects, compiled."""

    tenant: str
    roles: dict[str, ApiRoleDef] = field(default_factory=dict)
    index: dict[str, RoleIndex] = field(default_factory=dict)
    lines: dict[str, list[PLine]] = field(default_factory=dict)
    owner_rules: dict[str, list[tuple[frozenset[str], frozenset[str], str]]] = field(
        default_factory=dict
    )
    # Each binding and the key of the role it references; the role is resolved at
    # `compose` (it may be a policy-file role or come later).
    bindings: list[ApiBindingDef] = field(default_factory=list)
    # Per binding (same order): role key, domain, label, subject keys.
    links: list[tuple[str, str, str, tuple[str, ...]]] = field(default_factory=list)
    limits: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    # "origin: field: message" of every object skipped as broken.
    broken: list[str] = field(default_factory=list)
    # What this unit adds to the joined policy, resolved against one files' engine
    # (`resolve`): computed again only when the files change.
    fragment: Fragment | None = None


@dataclass
class Fragment:
    """A tenant unit's share of the joined engine, against the files' engine `files`:
    its roles (those no file role shadows), their index and lines, its bindings whose
    role exists, and their links merged with the files' links of the same keys."""

    files: PolicyEngine
    roles: dict[str, RoleDef]
    index: dict[str, RoleIndex]
    p_lines: list[PLine]
    owner_rules: list[tuple[frozenset[str], frozenset[str], str]]
    bindings: list[BindingDef]
    g_lines: list[GLine]
    link_bindings: dict[GLine, list[BindingDef]]
    links: dict[tuple[str, str], dict[str, str]]
    notes: list[str]


def resolve(unit: TenantUnit, files: PolicyEngine) -> Fragment:
    """`unit.fragment` against `files`, computed when missing or stale. Each unit's keys
    are its own tenant's (its domains are `{tenant}` and `{tenant}/{ns}`, its role keys
    name its tenant), so fragments of different units never share a key."""
    found = unit.fragment
    if found is not None and found.files is files:
        return found
    file_roles = files.policy.roles
    notes = list(unit.broken)
    roles: dict[str, RoleDef] = {}
    index: dict[str, RoleIndex] = {}
    p_lines: list[PLine] = []
    owner_rules: list[tuple[frozenset[str], frozenset[str], str]] = []
    for key, role in unit.roles.items():
        if key in file_roles:
            notes.append(f"{role.label}: a policy file defines this role; ignored")
            continue
        roles[key] = role
        index[key] = unit.index[key]
        p_lines.extend(unit.lines.get(key, ()))
        owner_rules.extend(unit.owner_rules.get(key, ()))
    bindings: list[BindingDef] = []
    g_lines: list[GLine] = []
    link_bindings: dict[GLine, list[BindingDef]] = {}
    links: dict[tuple[str, str], dict[str, str]] = {}
    file_link_bindings = files.compiled.link_bindings
    file_links = files.link_index
    for i, (key, dom, label, subs) in enumerate(unit.links):
        target_role = roles.get(key) or file_roles.get(key)
        if target_role is None:
            continue  # its role does not exist (yet): grants nothing
        binding = unit.bindings[i]
        if binding.role is not target_role:
            binding = unit.bindings[i] = dataclasses.replace(binding, role=target_role)
        bindings.append(binding)
        for sub in subs:
            link = (sub, key, dom)
            seen = link_bindings.get(link)
            if seen is None:
                in_files = file_link_bindings.get(link)
                if in_files is None:
                    g_lines.append(link)
                link_bindings[link] = [*(in_files or ()), binding]
            else:
                seen.append(binding)
            inner = links.get((dom, sub))
            if inner is None:
                inner = links[(dom, sub)] = dict(file_links.get((dom, sub), {}))
            inner.setdefault(key, label)
    fragment = Fragment(
        files, roles, index, p_lines, owner_rules, bindings, g_lines, link_bindings, links, notes
    )
    unit.fragment = fragment
    return fragment


def compile_tenant(tenant: str, objects: Iterable[StoredObject]) -> TenantUnit:
    unit = TenantUnit(tenant)
    for obj in sorted(objects, key=lambda o: o.key):
        checked = check_object(obj.kind, obj.body, obj.tenant, obj.namespace)
        if checked.problems:
            field_, message = checked.problems[0]
            unit.broken.append(f"{obj.origin}: {field_}: {message}")
            continue
        if checked.role is not None:
            unit.roles[checked.role.key] = checked.role
        elif checked.binding is not None:
            b = checked.binding
            unit.bindings.append(b)
            unit.links.append((b.role_ref, b.domain, b.label, tuple(x.key for x in b.subjects)))
        elif checked.limits is not None:
            ns = unit.limits.setdefault((obj.tenant, obj.namespace), {})
            for res, hard in checked.limits.items():
                ns[res] = min(hard, ns.get(res, hard))
    if unit.roles:
        compiled = compile_rbac(RbacPolicy(dict(unit.roles), ()))
        for line in compiled.p_lines:
            unit.lines.setdefault(line[0], []).append(line)
        unit.index = index_roles(unit.roles.values(), compiled.p_lines)
        for key, role in unit.roles.items():
            owned = owner_rule_keys([role])
            if owned:
                unit.owner_rules[key] = owned
    return unit


# -- joining the sources -------------------------------------------------------------


@dataclass(frozen=True)
class ApiLayer:
    """Every tenant's compiled API objects, and the digest of what they were built
    from (the API part of the policy revision)."""

    units: Mapping[str, TenantUnit] = field(default_factory=dict)
    digest: str = ""
    objects: int = 0


def digest_of(objects: Iterable[StoredObject]) -> str:
    h = 0
    n = 0
    for obj in objects:
        n += 1
        key = "\0".join((*obj.key, obj.resource_version)).encode()
        h ^= int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return f"{h:016x}"[:12] if n else ""


@dataclass
class Composed:
    engine: PolicyEngine
    quotas: QuotaPolicy
    notes: list[str]


def compose_engine(files: PolicyEngine, layer: ApiLayer, revision: str) -> Composed:
    """The files' engine joined with every tenant's API parts: the one policy. Each
    unit's fragment is reused while the files stay the same, so joining costs a copy of
    the files' dicts and one `update` per tenant, never a pass over every object."""
    fp = files.policy
    fc = files.compiled
    fragments = [resolve(unit, files) for unit in layer.units.values()]
    roles: dict[str, RoleDef] = dict(fp.roles)
    index = dict(files.role_index)
    link_bindings = dict(fc.link_bindings)
    links = dict(files.link_index)
    notes: list[str] = []
    for f in fragments:
        roles.update(f.roles)
        index.update(f.index)
        link_bindings.update(f.link_bindings)
        links.update(f.links)
        if f.notes:
            notes.extend(f.notes)
    p_lines = list(itertools.chain(fc.p_lines, *(f.p_lines for f in fragments)))
    g_lines = list(itertools.chain(fc.g_lines, *(f.g_lines for f in fragments)))
    owner_rules = list(itertools.chain(files.owner_rule_index, *(f.owner_rules for f in fragments)))
    bindings = tuple(itertools.chain(fp.bindings, *(f.bindings for f in fragments)))
    policy = RbacPolicy(roles, bindings)
    compiled = Compiled(fc.model_text, p_lines, g_lines, link_bindings)
    engine = PolicyEngine.assemble(revision, policy, compiled, index, links, owner_rules)
    return Composed(engine, QuotaPolicy(), notes)


def compose_quotas(files: QuotaPolicy, layer: ApiLayer) -> QuotaPolicy:
    """Namespace limits: the lowest of the files' and every API ResourceQuota's."""
    namespaces: dict[tuple[str, str], Mapping[str, int]] = dict(files.namespaces)
    from_objects: dict[tuple[str, str], frozenset[str]] = {}
    for unit in layer.units.values():
        for key, limits in unit.limits.items():
            if not limits:
                continue
            merged = dict(namespaces.get(key, {}))
            lowered = set()
            for res, hard in limits.items():
                if res not in merged or hard < merged[res]:
                    lowered.add(res)
                merged[res] = min(hard, merged.get(res, hard))
            namespaces[key] = merged
            from_objects[key] = frozenset(lowered)
    if not from_objects:
        return files
    return QuotaPolicy(files.configured, files.defaults, files.tenants, namespaces, from_objects)


def combined_revision(files_revision: str, layer: ApiLayer) -> str:
    return f"{files_revision}+{layer.digest}" if layer.digest else files_revision


def rule_text(rule: Rule) -> str:
    """A rule as Kubernetes writes it, for messages."""
    if rule.non_resource_urls:
        return f"{{nonResourceURLs:{list(rule.non_resource_urls)}, verbs:{list(rule.verbs)}}}"
    parts = [
        f"apiGroups:{list(rule.api_groups)}",
        f"resources:{list(rule.resources)}",
    ]
    if rule.resource_names:
        parts.append(f"resourceNames:{list(rule.resource_names)}")
    parts.append(f"verbs:{list(rule.verbs)}")
    if rule.owner:
        parts.append(f"when:owner({rule.owner_field})")
    return "{" + ", ".join(parts) + "}"


__all__ = [
    "KINDS",
    "RBAC_GROUP",
    "ApiBindingDef",
    "ApiLayer",
    "ApiRoleDef",
    "Checked",
    "StoredObject",
    "TenantUnit",
    "check_object",
    "combined_revision",
    "compile_tenant",
    "compose_engine",
    "compose_quotas",
    "digest_of",
    "kind_of",
    "origin",
    "role_key",
]


def compose_bundle(files: PolicyBundle, layer: ApiLayer) -> tuple[PolicyBundle, list[str]]:
    """The policy in force: the files' bundle joined with the API layer (the files'
    bundle itself when the store holds no API policy object)."""
    if not layer.digest:
        return files, []
    revision = combined_revision(files.revision, layer)
    with collector_paused():
        composed = compose_engine(files.engine, layer, revision)
    quotas = compose_quotas(files.quotas, layer)
    bundle = dataclasses.replace(files, revision=revision, engine=composed.engine, quotas=quotas)
    return bundle, composed.notes

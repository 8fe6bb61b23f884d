"""RBAC → Casbin: the model text, the policy lines, and the matcher's functions.

Owns every Casbin detail of the policy (with `engine.py`, which evaluates this model
over an index): the request and policy vectors, the matcher, and the three custom
functions it calls. `plain_enforcer()` builds an ordinary pycasbin Enforcer over the
same model and lines; the property test checks the indexed engine against it.

Vectors:
- request `r = sub, nd, td, scope, grp, res, name, act, own`: one caller subject key
  (`u:{tenant}:{user}` / `g:{tenant}:{group}`), the namespace domain `{t}/{ns}` (or
  `-`), the tenant domain (the target's tenant; the caller's own for cluster-scoped
  targets, where only owner rules apply), the scope (`cluster|tenant|namespace|url`),
  API group, `resource[/subresource]` (or the path for `url`), name, verb, and `own`
  (`owned` when the caller's tenant owns the object, else empty).
- policy `p = sub, kind, grp, res, name, act, cond, id`: a role key, `res|url`,
  comma-joined sets (`*` = any), `cond` = `owner:{field}` for `when: owner` rules,
  and the rule id `file:line`.
- grouping `g = subject, role, domain` where domain is `*` (ClusterRoleBinding),
  `{tenant}` (TenantRoleBinding) or `{tenant}/{namespace}` (RoleBinding). Domains are
  looked up exactly (three lookups per request), never pattern-matched.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import casbin
from casbin.model import Model

from sidecar.policy.rbac import BindingDef, RbacPolicy, parse_rbac
from sidecar.policy.source.files import Document, load_documents

MODEL_TEXT = """\
[request_definition]
r = sub, nd, td, scope, grp, res, name, act, own

[policy_definition]
p = sub, kind, grp, res, name, act, cond, id

[role_definition]
g = _, _, _

[policy_effect]
e = some(where (p.eft == allow))

[matchers]
m = (g(r.sub, p.sub, r.nd) || (g(r.sub, p.sub, r.td) && tenantOk(r.scope, p.cond)) \
|| g(r.sub, p.sub, "*")) \
&& ruleMatch(r.scope, r.grp, r.res, r.name, r.act, p.kind, p.grp, p.res, p.name, p.act) \
&& ownerOk(r.own, p.cond)
"""

NO_DOMAIN = "-"
OWNED = "owned"
OWNER_PREFIX = "owner:"

PLine = tuple[str, str, str, str, str, str, str, str]
GLine = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Compiled:
    model_text: str
    p_lines: list[PLine]
    g_lines: list[GLine]
    # (subject, role, domain) → the bindings that produced that link, for explanations.
    link_bindings: dict[GLine, list[BindingDef]]


@functools.lru_cache(maxsize=65536)
def split_set(value: str) -> frozenset[str]:
    return frozenset(value.split(","))


# An access review's `*` ("any verb", "any group", "any resource": `kubectl auth can-i
# '*' '*'`), matched only by a rule with `*` in that place, as in Kubernetes. A request's
# own `*` is literal and matches nothing; this form never comes from a URL (the target
# parser refuses control characters) and reviews make it from an exact `*` only.
ANY = "\x00*"


def _bad_request_value(value: str) -> bool:
    if value.startswith(ANY):
        value = value[len(ANY) :]
    return "*" in value


def tenant_ok(scope: str, cond: str) -> bool:
    """A tenant's own bindings reach cluster-scoped targets only through owner rules."""
    return scope != "cluster" or cond.startswith(OWNER_PREFIX)


def owner_ok(own: str, cond: str) -> bool:
    return cond == "" or own == OWNED


def rule_match(
    scope: str,
    grp: str,
    res: str,
    name: str,
    act: str,
    kind: str,
    pgrp: str,
    pres: str,
    pname: str,
    pact: str,
) -> bool:
    """Kubernetes rule matching. Request values are literal: a request naming `*` (or
    anything with `*` in its group, resource or verb) matches nothing; an access
    review's "any" (`ANY`) matches the rules with `*` there."""
    if _bad_request_value(act):
        return False
    verbs = split_set(pact)
    if "*" not in verbs and act not in verbs:
        return False
    if scope == "url":
        if kind != "url":
            return False
        for pattern in split_set(pres):
            if pattern == "*" or pattern == res:
                return True
            if pattern.endswith("*") and res.startswith(pattern[:-1]):
                return True
        return False
    if kind != "res" or _bad_request_value(grp) or _bad_request_value(res) or not res:
        return False
    groups = split_set(pgrp)
    if "*" not in groups and grp not in groups:
        return False
    resources = split_set(pres)
    if "*" not in resources and res not in resources:
        _, slash, sub = res.partition("/")
        if not slash or f"*/{sub}" not in resources:
            return False
    if pname:
        return name != "" and name in split_set(pname)
    return True


FUNCTIONS: dict[str, Any] = {
    "ruleMatch": rule_match,
    "tenantOk": tenant_ok,
    "ownerOk": owner_ok,
}


def compile_rbac(policy: RbacPolicy) -> Compiled:
    p_lines: list[PLine] = []
    bound_roles: dict[str, None] = {}
    g_lines: list[GLine] = []
    link_bindings: dict[GLine, list[BindingDef]] = {}
    for binding in policy.bindings:
        role_key = binding.role.key
        domain = binding.domain
        bound_roles[role_key] = None
        for subject in binding.subjects:
            link = (subject.key, role_key, domain)
            bindings = link_bindings.get(link)
            if bindings is None:
                link_bindings[link] = [binding]
                g_lines.append(link)
            else:
                bindings.append(binding)
    for role in policy.roles.values():
        role_key = role.key
        for rule in role.rules:
            verbs = ",".join(rule.verbs)
            if rule.non_resource_urls:
                p_lines.append(
                    (
                        role_key,
                        "url",
                        "",
                        ",".join(rule.non_resource_urls),
                        "",
                        verbs,
                        "",
                        rule.rule_id,
                    )
                )
            else:
                cond = OWNER_PREFIX + rule.owner_field if rule.owner else ""
                p_lines.append(
                    (
                        role_key,
                        "res",
                        ",".join(rule.api_groups),
                        ",".join(rule.resources),
                        ",".join(rule.resource_names),
                        verbs,
                        cond,
                        rule.rule_id,
                    )
                )
    return Compiled(MODEL_TEXT, p_lines, g_lines, link_bindings)


def compile_documents(docs: Sequence[Document]) -> tuple[Compiled, list[Any]]:
    policy, problems = parse_rbac(docs)
    return compile_rbac(policy), problems


def new_model() -> Model:
    model = Model()
    model.load_model_from_text(MODEL_TEXT)
    return model


def plain_enforcer(compiled: Compiled) -> casbin.Enforcer:
    """An ordinary pycasbin Enforcer over the compiled model and lines (scans them all).
    Used by tests and tooling, never on the request path."""
    enforcer = casbin.Enforcer(new_model())
    # Exact domain/role names only: the default equality matching_func makes the
    # domain manager quadratic per new domain (research/casbin.md).
    rm = enforcer.get_role_manager()
    rm.matching_func = None
    rm.domain_matching_func = None
    enforcer.model.add_policies("p", "p", [list(p) for p in compiled.p_lines])
    enforcer.model.add_policies("g", "g", [list(g) for g in compiled.g_lines])
    enforcer.build_role_links()
    for name, fn in FUNCTIONS.items():
        enforcer.add_function(name, fn)
    return enforcer


def _field(value: str) -> str:
    if value == "" or any(c in value for c in ', "'):
        return '"' + value.replace('"', '""') + '"'
    return value


def format_compiled(compiled: Compiled) -> str:
    """The model, then the policy in Casbin's CSV policy-file form."""
    out = [compiled.model_text.rstrip(), "", "# policy"]
    out += ["p, " + ", ".join(_field(v) for v in line) for line in compiled.p_lines]
    out += ["g, " + ", ".join(_field(v) for v in line) for line in compiled.g_lines]
    return "\n".join(out) + "\n"


def print_compiled(paths: Sequence[str]) -> int:
    """`sidecar policy compile DIR…`: print the model and policy; 1 if there are problems
    (they go to stderr and the affected documents are left out)."""
    import sys

    result = load_documents(paths)
    compiled, problems = compile_documents(result.documents)
    for problem in [*result.problems, *problems]:
        print(problem, file=sys.stderr)
    sys.stdout.write(f"# revision {result.revision}\n")
    sys.stdout.write(format_compiled(compiled))
    return 1 if problems or result.problems else 0

"""Validation of the RBAC kinds: every meaning error is a problem with file:line."""

from __future__ import annotations

import textwrap

import pytest

from sidecar.policy.rbac import RbacPolicy, parse_rbac
from sidecar.policy.source.files import parse_yaml_documents

BASE = """\
kind: ClusterRole
metadata: {name: view}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get]
---
kind: TenantRole
metadata: {name: admin, tenant: acme}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: ["*"]
---
kind: Role
metadata: {name: ed, tenant: acme, namespace: dev}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create]
"""


def _parse(extra: str) -> tuple[RbacPolicy, list[str]]:
    docs, problems = parse_yaml_documents(BASE + "---\n" + textwrap.dedent(extra), "p.yaml")
    assert problems == []
    policy, problems = parse_rbac(docs)
    return policy, [str(p) for p in problems]


def test_base_is_clean() -> None:
    policy, problems = _parse("kind: ClusterRole\nmetadata: {name: other}\nrules: []\n")
    assert problems == []
    assert set(policy.roles) == {"cr:view", "tr:acme:admin", "r:acme:dev:ed", "cr:other"}
    assert policy.rule_ids() == ["p.yaml:4", "p.yaml:11", "p.yaml:18"]


# (snippet, expected line, expected message fragment); the snippet starts at line 22.
BAD = [
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [pods]\n"
        "  verbs: [get]\n  colour: red\n",
        28,
        "unknown field 'colour' in rule",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x, labels: {}}\nspec: {}\nrules: []\n",
        24,
        "unknown field 'spec' in ClusterRole",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [pods]\n"
        "  verbs: [get, fly]\n",
        27,
        "unknown verb 'fly'",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [pods]\n"
        "  verbs: [GET]\n",
        27,
        "unknown verb 'GET'",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- nonResourceURLs: [/healthz]\n"
        "  verbs: [list]\n",
        26,
        "unknown verb 'list' for nonResourceURLs",
    ),
    (
        "kind: TenantRole\nmetadata: {name: x, tenant: acme}\nrules:\n- nonResourceURLs: [/h]\n"
        "  verbs: [get]\n",
        25,
        "only allowed in a ClusterRole",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [nodes]\n"
        "  verbs: [deletecollection]\n  when: owner\n",
        27,
        "has no meaning for verb",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- nonResourceURLs: [/h]\n  verbs: [get]\n"
        "  when: owner\n",
        27,
        "no meaning for nonResourceURLs",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [nodes]\n"
        "  verbs: [get]\n  when: always\n",
        28,
        "'when' must be 'owner'",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [nodes]\n"
        "  verbs: [get]\n  ownerField: spec.owner\n",
        28,
        "'ownerField' needs 'when: owner'",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [nodes]\n"
        "  verbs: [get]\n  when: owner\n  ownerField: 'spec..owner'\n",
        29,
        "dotted field path",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n"
        "  resources: ['po*']\n  verbs: [get]\n",
        26,
        "'*' may only stand alone",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: [pods]\n"
        "  resourceNames: ['web-*']\n  verbs: [get]\n",
        27,
        "names are literal",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- resources: [pods]\n  verbs: [get]\n",
        25,
        "needs 'apiGroups'",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  verbs: [get]\n",
        25,
        "needs 'resources' or 'nonResourceURLs'",
    ),
    (
        "kind: ClusterRole\nmetadata: {name: x}\nrules:\n- apiGroups: ['']\n  resources: ['a,b']\n"
        "  verbs: [get]\n",
        26,
        "contains ','",
    ),
    ("kind: ClusterRole\nmetadata: {name: view}\nrules: []\n", 23, "duplicate ClusterRole 'view'"),
    (
        "kind: ClusterRole\nmetadata: {name: x, tenant: acme}\nrules: []\n",
        23,
        "metadata.tenant is not allowed",
    ),
    ("kind: TenantRole\nmetadata: {name: x}\nrules: []\n", 23, "needs metadata.tenant"),
    ("kind: Role\nmetadata: {name: x, tenant: acme}\nrules: []\n", 23, "needs metadata.namespace"),
    ("kind: TenantRole\nmetadata: {name: x, tenant: '*'}\nrules: []\n", 23, "not a valid tenant"),
    ("kind: TenantRole\nmetadata: {name: x, tenant: Acme}\nrules: []\n", 23, "not a valid tenant"),
    (
        "kind: RoleBinding\nmetadata: {name: b, tenant: acme, namespace: dev}\n"
        "roleRef: {kind: Role, name: missing}\nsubjects: [{kind: User, name: a}]\n",
        24,
        "Role 'missing' does not exist in acme/dev",
    ),
    (
        "kind: RoleBinding\nmetadata: {name: b, tenant: acme, namespace: prod}\n"
        "roleRef: {kind: Role, name: ed}\nsubjects: [{kind: User, name: a}]\n",
        24,
        "Role 'ed' does not exist in acme/prod",
    ),
    (
        "kind: TenantRoleBinding\nmetadata: {name: b, tenant: beta}\n"
        "roleRef: {kind: TenantRole, name: admin}\nsubjects: [{kind: User, name: a}]\n",
        24,
        "TenantRole 'admin' does not exist in tenant 'beta'",
    ),
    (
        "kind: TenantRoleBinding\nmetadata: {name: b, tenant: beta}\n"
        "roleRef: {kind: TenantRole, name: admin, tenant: acme}\nsubjects: [{kind: User, name: a}]\n",
        24,
        "roleRef names a TenantRole of another tenant",
    ),
    (
        "kind: TenantRoleBinding\nmetadata: {name: b, tenant: acme}\n"
        "roleRef: {kind: Role, name: ed}\nsubjects: [{kind: User, name: a}]\n",
        24,
        "may reference TenantRole or ClusterRole, not 'Role'",
    ),
    (
        "kind: ClusterRoleBinding\nmetadata: {name: b}\n"
        "roleRef: {kind: TenantRole, name: admin}\nsubjects: [{kind: User, name: a}]\n",
        24,
        "may reference ClusterRole",
    ),
    (
        "kind: TenantRoleBinding\nmetadata: {name: b, tenant: acme}\n"
        "roleRef: {kind: ClusterRole, name: view}\nsubjects:\n- {kind: User, name: a, tenant: beta}\n",
        26,
        "names a subject of tenant 'beta'",
    ),
    (
        "kind: RoleBinding\nmetadata: {name: b, tenant: acme, namespace: dev}\n"
        "roleRef: {kind: ClusterRole, name: view}\nsubjects:\n- {kind: Group, name: g, tenant: x}\n",
        26,
        "names a subject of tenant 'x'",
    ),
    (
        "kind: ClusterRoleBinding\nmetadata: {name: b}\n"
        "roleRef: {kind: ClusterRole, name: view}\nsubjects:\n- {kind: User, name: '*'}\n",
        26,
        "matches no one",
    ),
    (
        "kind: ClusterRoleBinding\nmetadata: {name: b}\n"
        "roleRef: {kind: ClusterRole, name: view}\nsubjects:\n- {kind: Robot, name: r}\n",
        26,
        "subject kind must be",
    ),
    (
        "kind: ClusterRoleBinding\nmetadata: {name: b}\n"
        "roleRef: {kind: ClusterRole, name: view}\nsubjects:\n- {kind: User, name: r, team: x}\n",
        26,
        "unknown field 'team' in subject",
    ),
    (
        "kind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {kind: ClusterRole, name: view}\n"
        "subjects:\n- {kind: Group, name: system:authenticated, tenant: acme}\n",
        26,
        "takes no tenant",
    ),
    (
        "kind: TenantRoleBinding\nmetadata: {name: b, tenant: acme}\n"
        "roleRef: {kind: ClusterRole, name: view}\nsubjects:\n- {kind: Group, name: system:masters}\n",
        26,
        "reserved",
    ),
    (
        "kind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {kind: ClusterRole, name: view}\n"
        "subjects: []\n",
        25,
        "non-empty 'subjects'",
    ),
    (
        "kind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {kind: ClusterRole, name: view, x: 1}\n"
        "subjects: [{kind: User, name: u}]\n",
        24,
        "unknown field 'x' in roleRef",
    ),
]


@pytest.mark.parametrize(("snippet", "line", "fragment"), BAD)
def test_problem_with_file_and_line(snippet: str, line: int, fragment: str) -> None:
    _, problems = _parse(snippet)
    assert any(p.startswith(f"p.yaml:{line}: ") and fragment in p for p in problems), problems


def test_bad_documents_grant_nothing() -> None:
    policy, problems = _parse(
        "kind: TenantRoleBinding\nmetadata: {name: b, tenant: acme}\n"
        "roleRef: {kind: ClusterRole, name: view}\nsubjects:\n"
        "- {kind: User, name: a}\n- {kind: User, name: z, tenant: beta}\n"
    )
    assert problems
    assert policy.bindings == ()


def test_rule_with_resources_and_urls_splits() -> None:
    policy, problems = _parse(
        "kind: ClusterRole\nmetadata: {name: both}\nrules:\n- apiGroups: ['']\n"
        "  resources: [pods]\n  nonResourceURLs: [/h]\n  verbs: [get]\n"
    )
    assert problems == []
    rules = policy.roles["cr:both"].rules
    assert [(r.resources, r.non_resource_urls) for r in rules] == [(("pods",), ()), ((), ("/h",))]
    assert rules[0].rule_id == rules[1].rule_id == "p.yaml:25"


def test_crb_subject_tenant_defaults_to_system_and_sa_namespace() -> None:
    policy, problems = _parse(
        "kind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {kind: ClusterRole, name: view}\n"
        "subjects:\n- {kind: User, name: root}\n- {kind: ServiceAccount, name: bot, tenant: acme}\n"
        "- {kind: Group, name: system:authenticated}\n"
    )
    assert problems == []
    keys = [s.key for s in policy.bindings[0].subjects]
    assert keys == [
        "u:system:root",
        "u:acme:system:serviceaccount:default:bot",
        "g:*:system:authenticated",
    ]

"""The API policy source (sidecar/policy/source/api.py) and escalation prevention
(sidecar/policy/escalation.py), without processes: validation names fields, the
union with the files' policy, origins in explanations, per-tenant compilation, and
rule coverage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.core.identity import Identity
from sidecar.core.target import parse_target
from sidecar.policy.decide import decide
from sidecar.policy.escalation import binding_write_refusal, covered, role_write_refusal
from sidecar.policy.rbac import Rule
from sidecar.policy.source.api import (
    ApiLayer,
    StoredObject,
    check_object,
    compile_tenant,
    compose_bundle,
    digest_of,
)
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.tools.rules import ResourceRule, RulesInForce
from sidecar.policy.tools.whocan import who_can

FILES = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
---
kind: TenantRoleBinding
metadata: {name: admins, tenant: acme}
roleRef: {kind: ClusterRole, name: everything}
subjects:
- {kind: Group, name: admins}
---
kind: Role
metadata: {name: files-role, tenant: acme, namespace: dev}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
"""


@pytest.fixture
def files(tmp_path: Path) -> PolicyBundle:
    (tmp_path / "p.yaml").write_text(FILES)
    bundle, problems = load_bundle([tmp_path])
    assert problems == []
    return bundle


def obj(
    kind: str, tenant: str, ns: str, name: str, body: dict[str, Any], rv: str = "1"
) -> StoredObject:
    return StoredObject(kind, tenant, ns, name, {"metadata": {"name": name}, **body}, rv)


READER = {"rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}


def bind(kind: str, ref: str, *users: str) -> dict[str, Any]:
    return {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": ref},
        "subjects": [{"kind": "User", "name": u} for u in users],
    }


def layer_of(*objects: StoredObject) -> ApiLayer:
    by_tenant: dict[str, list[StoredObject]] = {}
    for o in objects:
        by_tenant.setdefault(o.tenant, []).append(o)
    units = {t: compile_tenant(t, objs) for t, objs in by_tenant.items()}
    return ApiLayer(units, digest_of(objects), len(objects))


def verdict(bundle: PolicyBundle, user: str, tenant: str, method: str, path: str) -> Any:
    return decide(bundle, Identity(user, tenant), parse_target(method, path))


def test_validation_names_the_field() -> None:
    bad = {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "fly"]}]}
    checked = check_object("Role", {"metadata": {"name": "r"}, **bad}, "acme", "dev")
    assert [f for f, _ in checked.problems] == ["rules[0].verbs[1]"]
    checked = check_object(
        "RoleBinding",
        {
            "metadata": {"name": "b"},
            **bind("Role", "r"),
            "subjects": [{"kind": "User", "name": "x", "tenant": "beta"}],
        },
        "acme",
        "dev",
    )
    assert [f for f, _ in checked.problems] == ["subjects[0].tenant"]
    checked = check_object(
        "TenantRoleBinding", {"metadata": {"name": "b"}, **bind("Role", "r", "x")}, "acme", ""
    )
    assert [f for f, _ in checked.problems] == ["roleRef.kind"]
    # The store's own metadata is not a problem; the body's tenant is never read.
    meta = {"name": "r", "uid": "u", "resourceVersion": "9", "tenant": "beta", "managedFields": []}
    checked = check_object("Role", {"metadata": meta, **READER}, "acme", "dev")
    assert checked.problems == ()
    assert checked.role is not None
    assert checked.role.tenant == "acme"


def test_quota_objects_take_kubernetes_quantities() -> None:
    checked = check_object(
        "ResourceQuota",
        {"metadata": {"name": "q"}, "spec": {"hard": {"servers": "3", "cpu": "500m"}}},
        "acme",
        "dev",
    )
    assert checked.problems == ()
    assert checked.limits == {"servers": 3, "requests.cpu": 500}
    checked = check_object(
        "ResourceQuota",
        {"metadata": {"name": "q"}, "spec": {"hard": {"widgets": "3"}}},
        "acme",
        "dev",
    )
    assert [f for f, _ in checked.problems] == ["spec.hard.widgets"]


def test_the_union_grants_with_the_origin_named(files: PolicyBundle) -> None:
    layer = layer_of(
        obj("Role", "acme", "dev", "r1", READER),
        obj("RoleBinding", "acme", "dev", "bob-reads", bind("Role", "r1", "bob")),
        obj("RoleBinding", "acme", "dev", "bob-pods", bind("Role", "files-role", "bob")),
    )
    bundle, notes = compose_bundle(files, layer)
    assert notes == []
    assert bundle.revision == f"{files.revision}+{layer.digest}"
    v = verdict(bundle, "bob", "acme", "GET", "/api/v1/tenants/acme/namespaces/dev/configmaps")
    assert v.outcome == "allow"
    assert v.explanation.startswith("rolebinding acme/dev/bob-reads → role acme/dev/r1")
    assert v.rule_id == "role acme/dev/r1 rules[0]"
    v = verdict(bundle, "bob", "acme", "GET", "/api/v1/tenants/acme/namespaces/dev/pods/p")
    assert v.outcome == "allow"  # an API binding to a files' role
    assert (
        verdict(
            bundle, "bob", "acme", "GET", "/api/v1/tenants/acme/namespaces/prod/configmaps"
        ).outcome
        == "deny"
    )
    # The files' grants still stand; without the API objects bob has nothing.
    assert (
        verdict(
            bundle, "ann", "acme", "GET", "/api/v1/tenants/acme/namespaces/dev/configmaps"
        ).outcome
        == "deny"
    )
    assert (
        verdict(
            files, "bob", "acme", "GET", "/api/v1/tenants/acme/namespaces/dev/configmaps"
        ).outcome
        == "deny"
    )
    # who-can sees the API binding.
    target = parse_target("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps")
    holders = who_can(bundle, target)
    assert any("bob" in h.subject and "rolebinding acme/dev/bob-reads" in h.via for h in holders)


def test_a_binding_to_a_missing_role_waits_for_it_and_broken_objects_are_skipped(
    files: PolicyBundle,
) -> None:
    binding = obj("RoleBinding", "acme", "dev", "early", bind("Role", "later", "bob"))
    broken = obj(
        "RoleBinding",
        "acme",
        "dev",
        "bad",
        {**bind("Role", "later"), "subjects": [{"kind": "User", "name": "eve", "tenant": "beta"}]},
    )
    bundle, notes = compose_bundle(files, layer_of(binding, broken))
    assert notes == [
        "rolebinding acme/dev/bad: subjects[0].tenant: RoleBinding in tenant 'acme' names a subject of tenant 'beta'; only ClusterRoleBindings grant across tenants"
    ]
    path = "/api/v1/tenants/acme/namespaces/dev/configmaps"
    assert verdict(bundle, "bob", "acme", "GET", path).outcome == "deny"
    bundle, _ = compose_bundle(
        files, layer_of(binding, broken, obj("Role", "acme", "dev", "later", READER))
    )
    assert verdict(bundle, "bob", "acme", "GET", path).outcome == "allow"
    assert verdict(bundle, "eve", "beta", "GET", path).outcome == "notfound"


def test_one_tenants_change_leaves_the_others_units_alone(files: PolicyBundle) -> None:
    acme = compile_tenant("acme", [obj("Role", "acme", "dev", "r1", READER)])
    beta = compile_tenant("beta", [obj("Role", "beta", "dev", "r1", READER)])
    layer = ApiLayer({"acme": acme, "beta": beta}, "x", 2)
    first, _ = compose_bundle(files, layer)
    acme2 = compile_tenant(
        "acme",
        [
            obj("Role", "acme", "dev", "r1", READER),
            obj("RoleBinding", "acme", "dev", "b", bind("Role", "r1", "bob")),
        ],
    )
    second, _ = compose_bundle(files, ApiLayer({"acme": acme2, "beta": beta}, "y", 3))
    key = "r:beta:dev:r1"
    assert second.engine.policy.roles[key] is first.engine.policy.roles[key]
    assert second.engine.role_index[key] is first.engine.role_index[key]


def test_a_namespace_quota_is_the_lowest_limit(files: PolicyBundle) -> None:
    def q(name: str, n: int) -> StoredObject:
        return obj("ResourceQuota", "acme", "dev", name, {"spec": {"hard": {"servers": str(n)}}})

    bundle, _ = compose_bundle(files, layer_of(q("a", 5), q("b", 3)))
    assert bundle.quotas.namespace_limits("acme", "dev") == {"servers": 3}
    assert bundle.quotas.namespace_limits("acme", "prod") == {}


def rule(
    verbs: list[str], groups: list[str], resources: list[str], names: list[str] | None = None
) -> Rule:
    return Rule("t", tuple(verbs), tuple(groups), tuple(resources), tuple(names or ()))


def held(*rules: ResourceRule) -> RulesInForce:
    return RulesInForce(resource_rules=list(rules))


def test_coverage_follows_kubernetes() -> None:
    pods = ResourceRule(("get", "list"), ("",), ("pods",))
    assert covered(held(pods), rule(["get"], [""], ["pods"]))
    assert not covered(held(pods), rule(["get"], [""], ["pods/log"]))
    assert not covered(held(pods), rule(["*"], [""], ["pods"]))
    assert not covered(held(pods), rule(["get"], ["*"], ["pods"]))
    assert covered(held(ResourceRule(("*",), ("*",), ("*",))), rule(["*"], ["*"], ["*"]))
    assert covered(
        held(ResourceRule(("get",), ("",), ("*/log",))), rule(["get"], [""], ["pods/log"])
    )
    named = ResourceRule(("get",), ("",), ("pods",), ("a",))
    assert covered(held(named), rule(["get"], [""], ["pods"], ["a"]))
    assert not covered(held(named), rule(["get"], [""], ["pods"], ["a", "b"]))
    assert not covered(held(named), rule(["get"], [""], ["pods"]))
    # Two held rules together cover what neither does alone.
    assert covered(
        held(ResourceRule(("get",), ("",), ("pods",)), ResourceRule(("list",), ("",), ("pods",))),
        rule(["get", "list"], [""], ["pods"]),
    )
    assert covered(held(pods), rule(["get"] * 400, [""] * 400, ["pods"])) is True


ESCALATE = {
    "apiGroups": ["rbac.authorization.k8s.io"],
    "resources": ["roles"],
    "verbs": ["escalate"],
}


def test_escalation_checks_use_the_policy_in_force(files: PolicyBundle) -> None:
    layer = layer_of(
        obj(
            "Role",
            "acme",
            "dev",
            "writer",
            {
                "rules": [
                    {
                        "apiGroups": ["rbac.authorization.k8s.io"],
                        "resources": ["roles", "rolebindings"],
                        "verbs": ["create"],
                    },
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
                ]
            },
        ),
        obj("RoleBinding", "acme", "dev", "w", bind("Role", "writer", "bob")),
        obj(
            "Role",
            "acme",
            "dev",
            "escalator",
            {
                "rules": [
                    {
                        "apiGroups": ["rbac.authorization.k8s.io"],
                        "resources": ["roles"],
                        "verbs": ["escalate"],
                    },
                ]
            },
        ),
    )
    bundle, _ = compose_bundle(files, layer)
    bob, admin = Identity("bob", "acme"), Identity("ann", "acme", ("admins",))
    secrets = check_object(
        "Role",
        {
            "metadata": {"name": "s"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
        },
        "acme",
        "dev",
    ).role
    assert secrets is not None
    refusal = role_write_refusal(bundle.engine, bob, secrets)
    assert refusal is not None
    assert "secrets" in refusal
    assert role_write_refusal(bundle.engine, admin, secrets) is None
    cm = check_object(
        "Role",
        {
            "metadata": {"name": "c"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
        "acme",
        "dev",
    ).role
    assert cm is not None
    assert role_write_refusal(bundle.engine, bob, cm) is None
    to_admin = check_object(
        "RoleBinding",
        {"metadata": {"name": "x"}, **bind("ClusterRole", "everything", "bob")},
        "acme",
        "dev",
    ).binding
    assert to_admin is not None
    assert binding_write_refusal(bundle.engine, bob, to_admin) is not None
    assert binding_write_refusal(bundle.engine, admin, to_admin) is None
    # `escalate` lets bob write what he does not hold.
    escalating = layer_of(
        obj("Role", "acme", "dev", "escalator", {"rules": [ESCALATE]}),
        obj("RoleBinding", "acme", "dev", "e", bind("Role", "escalator", "bob")),
    )
    bundle, _ = compose_bundle(files, escalating)
    assert role_write_refusal(bundle.engine, bob, secrets) is None

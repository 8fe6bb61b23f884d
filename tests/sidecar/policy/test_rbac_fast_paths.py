"""The RBAC loader's shortcuts for common rules and subjects accept only what the
full checks accept and build the same objects: random roles and bindings, valid and
broken, give the same policy and the same problems with and without them."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.policy import rbac
from sidecar.policy.source.files import parse_yaml_documents

_WORDS = ["", "*", "pods", "pods/log", "*/scale", "a/b/c", "x*", "a,b", "a\nb", "compute"]
_WORDS += ["get", "list", "watch", "deletecollection", "bogus", "GET", "/api", "/api/*", "n1"]
_words = st.sampled_from(_WORDS)
_values = st.one_of(
    st.lists(_words, max_size=4),
    st.lists(st.one_of(_words, st.integers(), st.none(), st.lists(_words, max_size=1)), max_size=3),
    _words,
    st.none(),
    st.integers(),
)
_rule = st.dictionaries(
    st.sampled_from(
        [
            *("apiGroups", "resources", "resourceNames", "verbs", "nonResourceURLs"),
            *("when", "ownerField", "bogus"),
        ]
    ),
    _values,
).map(lambda d: {**d, "when": "owner"} if d.get("when") is not None else d)


# Rules of the shape the shortcut looks at: good values, and at most one field spoiled
# by a value on the other side of one of its limits (some the full check accepts).
_GOOD: dict[str, list[Any]] = {
    "apiGroups": ["", "compute", "*"],
    "resources": ["pods", "servers"],
    "verbs": sorted(rbac.RESOURCE_VERBS),
    "resourceNames": ["a", "b-1"],
}
_BAD: dict[str, list[Any]] = {
    "apiGroups": ["a,b", "x\ny", 5],
    "resources": ["", "*", "pods/log", "*/scale", "a/b/c", "x*", "a,b", None],
    "verbs": ["bogus", "head", "GET", ""],
    "resourceNames": ["", "*", "x,y", "a*", 7],
}


@st.composite
def _plain_rule(draw: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {
        key: draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
        for key, values in _GOOD.items()
    }
    if draw(st.booleans()):
        del rule["resourceNames"]
    spoiled = draw(st.sampled_from([None, *_BAD]))
    if spoiled is not None:
        how = draw(st.sampled_from(["add", "add", "empty", "scalar", "null"]))
        if how == "add":
            rule[spoiled] = [*rule.get(spoiled, []), draw(st.sampled_from(_BAD[spoiled]))]
        else:
            rule[spoiled] = {"empty": [], "scalar": "pods", "null": None}[how]
    return rule


_subject = st.dictionaries(
    st.sampled_from(["kind", "name", "tenant", "namespace", "apiGroup", "bogus"]),
    st.one_of(
        st.sampled_from(["User", "Group", "ServiceAccount", "Bogus", "alice", "*", ""]),
        st.sampled_from(["system:authenticated", "system:x", "a:b", "acme", "beta", "Bad!"]),
        st.sampled_from(["system", "dev", None, 5]),
    ),
)
_plain_subject = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["User", "Group", "ServiceAccount"]),
        "name": st.sampled_from(["alice", "devs", "system:x", "*", "", "system:authenticated"]),
    }
)


def _documents(draw: Any) -> str:
    docs: list[dict[str, Any]] = []
    roles = [("ClusterRole", "cr", {}), ("TenantRole", "tr", {"tenant": "acme"})]
    roles.append(("Role", "r", {"tenant": "acme", "namespace": "dev"}))
    for kind, name, scope in roles:
        rules = draw(st.lists(st.one_of(_rule, _plain_rule()), max_size=4))
        docs.append({"kind": kind, "metadata": {"name": name, **scope}, "rules": rules})
    bindings = [
        ("ClusterRoleBinding", {}, "ClusterRole", "cr"),
        ("TenantRoleBinding", {"tenant": "acme"}, "TenantRole", "tr"),
        ("RoleBinding", {"tenant": "acme", "namespace": "dev"}, "Role", "r"),
        ("TenantRoleBinding", {"tenant": "acme"}, "ClusterRole", "cr"),
    ]
    for i, (kind, scope, ref_kind, ref_name) in enumerate(bindings):
        subjects = draw(st.lists(st.one_of(_subject, _plain_subject), min_size=1, max_size=4))
        docs.append(
            {
                "kind": kind,
                "metadata": {"name": f"b{i}", **scope},
                "roleRef": {"kind": ref_kind, "name": ref_name},
                "subjects": subjects,
            }
        )
    return yaml.safe_dump_all(docs, width=10**6)


def _parse(text: str) -> tuple[str, list[str]]:
    docs, problems = parse_yaml_documents(text, "p.yaml")
    assert problems == []
    policy, found = rbac.parse_rbac(docs)
    return repr(policy), [str(p) for p in found]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_shortcuts_change_nothing(data: st.DataObject) -> None:
    text = _documents(data.draw)
    fast = _parse(text)
    with (
        mock.patch.object(rbac, "_plain_resource_rule", return_value=None),
        mock.patch.object(rbac, "_PLAIN_SUBJECT_FIELDS", frozenset()),
    ):
        full = _parse(text)
    assert fast == full


@settings(max_examples=1500, deadline=None)
@given(
    rule=st.one_of(_plain_rule(), _plain_rule(), _rule),
    kind=st.sampled_from(["ClusterRole", "Role"]),
)
def test_the_rule_shortcut_agrees_with_the_full_check(rule: dict[str, Any], kind: str) -> None:
    [doc], _ = parse_yaml_documents(yaml.safe_dump({"kind": kind, "rules": [rule]}), "p.yaml")
    raw = doc.body["rules"]
    problems: list[Any] = []
    checker = rbac._Checker(doc, problems)
    full = rbac._checked_rule(checker, raw[0], "p.yaml:3", kind, raw, 0)
    plain = rbac._plain_resource_rule(raw[0], "p.yaml:3")
    if plain is not None:
        assert problems == []
        assert full == [plain]
    assert rbac._parse_rule(rbac._Checker(doc, []), raw[0], "p.yaml:3", kind, raw, 0) == full


def test_the_shortcuts_are_taken_for_common_rules_and_subjects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = """\
kind: TenantRole
metadata: {tenant: acme, name: r}
rules:
- {apiGroups: ['', compute], resources: [pods, servers], verbs: [get, list]}
- {apiGroups: [''], resources: [pods], resourceNames: [a], verbs: ['*']}
---
kind: TenantRoleBinding
metadata: {tenant: acme, name: b}
roleRef: {kind: TenantRole, name: r}
subjects:
- {kind: User, name: alice}
- {kind: Group, name: devs}
"""
    docs, _ = parse_yaml_documents(text, "p.yaml")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the full rule check ran")

    class Refusing(frozenset[str]):
        def __contains__(self, key: object) -> bool:
            raise AssertionError("the full subject check ran")

    monkeypatch.setattr(rbac, "_checked_rule", refuse)
    monkeypatch.setattr(rbac, "_SUBJECT_FIELDS", Refusing())
    policy, problems = rbac.parse_rbac(docs)
    assert problems == []
    [role] = policy.roles.values()
    assert [r.resources for r in role.rules] == [("pods", "servers"), ("pods",)]
    assert [s.key for s in policy.bindings[0].subjects] == ["u:acme:alice", "g:acme:devs"]

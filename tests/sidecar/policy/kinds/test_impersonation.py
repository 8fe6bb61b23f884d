"""`sidecar.policy.kinds.impersonation`: the `Impersonate-*` headers read one way (400 for
malformed ones), and who may become whom, decided per attribute by the one decision
function in the impersonated tenant's scope (DESIGN §4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.policy.kinds.impersonation import (
    MAX_VALUES,
    Impersonation,
    case_headers,
    decide_impersonation,
    parse_impersonation,
    requested,
)
from sidecar.policy.source.bundle import PolicyBundle, load_bundle

POLICY = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: admin}]
---
kind: TenantRoleBinding
metadata: {name: admins, tenant: acme}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: alice}]
---
# Impersonating carol and the viewers group only, in acme.
kind: ClusterRole
metadata: {name: carol-only}
rules:
- {apiGroups: [""], resources: [users], resourceNames: [carol], verbs: [impersonate]}
- {apiGroups: [""], resources: [groups], resourceNames: [viewers], verbs: [impersonate]}
---
kind: TenantRoleBinding
metadata: {name: helpdesk, tenant: acme}
roleRef: {kind: ClusterRole, name: carol-only}
subjects: [{kind: User, name: hal}]
---
# A ClusterRoleBinding naming a tenant user: still never another tenant's user.
kind: ClusterRole
metadata: {name: impersonate-anyone}
rules:
- {apiGroups: ["", authentication.k8s.io], resources: ["*"], verbs: [impersonate]}
---
kind: ClusterRoleBinding
metadata: {name: roaming}
roleRef: {kind: ClusterRole, name: impersonate-anyone}
subjects: [{kind: User, name: rita, tenant: acme}]
---
# acme's auditors read nodes across tenants: a ClusterRoleBinding names the group.
kind: ClusterRoleBinding
metadata: {name: node-auditors}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: Group, name: node-auditors, tenant: acme}]
---
# A system operator bound in its own tenant only: never into another tenant.
kind: TenantRoleBinding
metadata: {name: local-ops, tenant: system}
roleRef: {kind: ClusterRole, name: impersonate-anyone}
subjects: [{kind: User, name: olga}]
"""

ADMIN = Identity("admin", "system")
ALICE = Identity("alice", "acme", ("tenant-admins",), "static-token")
HAL = Identity("hal", "acme")
RITA = Identity("rita", "acme")
OLGA = Identity("olga", "system")
NOBODY = Identity("nora", "acme", ("viewers",))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> PolicyBundle:
    root: Path = tmp_path_factory.mktemp("policies")
    (root / "policy.yaml").write_text(POLICY)
    loaded, problems = load_bundle([root])
    assert problems == [], [str(p) for p in problems]
    return loaded


def parse(*headers: tuple[str, str]) -> Impersonation | None:
    return parse_impersonation(headers)


def bad(*headers: tuple[str, str]) -> str:
    with pytest.raises(StatusError) as caught:
        parse_impersonation(headers)
    assert caught.value.code == 400
    return caught.value.message


# -- reading the headers ---------------------------------------------------------------


def test_no_impersonation_headers_is_none() -> None:
    assert parse(("Authorization", "Bearer x"), ("X-Remote-User", "eve")) is None
    assert not requested(["Authorization", "Accept"])
    assert requested(["accept", "IMPERSONATE-USER"])
    # A name Kubernetes does not read asks for nothing (the proxy drops it anyway).
    assert parse(("Impersonate-Someone", "eve")) is None


def test_every_header_kind_in_any_case() -> None:
    asked = parse(
        ("impersonate-user", "vera"),
        ("IMPERSONATE-GROUP", "viewers"),
        ("Impersonate-Group", "auditors"),
        ("Impersonate-Group", "viewers"),  # a group named twice counts once
        ("Impersonate-Uid", "1234"),
        ("Impersonate-Extra-Tenant", "acme"),
        ("Impersonate-Extra-Scopes", "view"),
        ("Impersonate-Extra-Scopes", "edit"),
    )
    assert asked == Impersonation(
        "vera",
        ("viewers", "auditors"),
        "1234",
        (("tenant", ("acme",)), ("scopes", ("view", "edit"))),
    )
    assert asked.tenant == "acme"
    assert [t.full_resource for t in asked.targets("acme")] == [
        "users",
        "groups",
        "groups",
        "userextras/tenant",
        "userextras/scopes",
        "userextras/scopes",
        "uids",
    ]


def test_an_extras_key_is_lowercased_then_percent_decoded() -> None:
    """As the Kubernetes API server reads it (client-go escapes the key)."""
    asked = parse(("Impersonate-User", "vera"), ("Impersonate-Extra-Example.com%2FTeam%20A", "x"))
    assert asked is not None
    assert asked.extra == (("example.com/team a", ("x",)),)
    # `%2F` decoded after lower-casing: `%2f` and `%2F` are the same key.
    again = parse(("Impersonate-User", "vera"), ("Impersonate-Extra-example.com%2fteam%20a", "y"))
    assert again is not None
    assert again.extra[0][0] == "example.com/team a"


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ([("Impersonate-User", "")], "Impersonate-User is empty"),
        ([("Impersonate-Group", "viewers")], "without impersonating a user"),
        ([("Impersonate-Uid", "1")], "without impersonating a user"),
        ([("Impersonate-Extra-Tenant", "acme")], "without impersonating a user"),
        ([("Impersonate-User", "a"), ("Impersonate-User", "b")], "given once"),
        ([("Impersonate-User", "a"), ("Impersonate-Uid", "1"), ("Impersonate-Uid", "2")], "once"),
        ([("Impersonate-User", "a"), ("Impersonate-Group", "")], "Impersonate-Group must be"),
        ([("Impersonate-User", "a\u2028b")], "Impersonate-User must be"),
        ([("Impersonate-User", "a" * 257)], "Impersonate-User must be"),
        ([("Impersonate-User", "a"), ("Impersonate-Uid", "")], "Impersonate-Uid must be"),
        ([("Impersonate-User", "a"), ("Impersonate-Extra-", "x")], "empty or malformed key"),
        ([("Impersonate-User", "a"), ("Impersonate-Extra-a%zz", "x")], "malformed key"),
        ([("Impersonate-User", "a"), ("Impersonate-Extra-a%ff", "x")], "not UTF-8"),
        ([("Impersonate-User", "a"), ("Impersonate-Extra-a%0a", "x")], "not a valid name"),
        ([("Impersonate-User", "a"), ("Impersonate-Extra-Tenant", "Not_A_Label")], "DNS-1123"),
        (
            [("Impersonate-User", "a"), *[("Impersonate-Extra-Tenant", t) for t in ("x", "y")]],
            "given once",
        ),
        ([("Impersonate-User", "a"), ("Impersonate-Extra-Scopes", "")], "must be"),
        (
            [("Impersonate-User", "a"), *[("Impersonate-Group", f"g{i}") for i in range(64)]],
            f"more than {MAX_VALUES}",
        ),
    ],
)
def test_malformed_headers_are_400(headers: list[tuple[str, str]], says: str) -> None:
    assert says in bad(*headers)


# -- deciding ------------------------------------------------------------------------------


def decided(
    bundle: PolicyBundle, caller: Identity, *headers: tuple[str, str]
) -> StatusError | None:
    asked = parse_impersonation(headers)
    assert asked is not None
    v = decide_impersonation(bundle, caller, asked)
    assert v.allowed == (v.error is None)
    return v.error


def test_a_tenant_binding_grants_impersonation_inside_its_tenant(bundle: PolicyBundle) -> None:
    assert decided(bundle, ALICE, ("Impersonate-User", "vera"), ("Impersonate-Group", "g")) is None
    both = (("Impersonate-Uid", "7"), ("Impersonate-Extra-Scopes", "s"))
    assert decided(bundle, ALICE, ("Impersonate-User", "vera"), *both) is None
    assert (
        decided(bundle, ALICE, ("Impersonate-User", "vera"), ("Impersonate-Extra-Tenant", "acme"))
        is None
    )


def test_the_identity_acted_as(bundle: PolicyBundle) -> None:
    asked = parse(("Impersonate-User", "vera"), ("Impersonate-Group", "viewers"))
    assert asked is not None
    assert asked.identity(ALICE) == Identity(
        "vera", "acme", ("viewers",), "static-token", impersonated_by=ALICE
    )
    across = parse(("Impersonate-User", "alice"), ("Impersonate-Extra-Tenant", "acme"))
    assert across is not None
    assert across.identity(ADMIN).tenant == "acme"
    assert across.identity(ADMIN).impersonated_by == ADMIN


def test_the_first_refused_attribute_is_named_in_kubernetes_words(bundle: PolicyBundle) -> None:
    """hal may become carol of the viewers only: user, then groups, then extras, then
    uid are checked, and the first refused one is named."""
    assert (
        decided(bundle, HAL, ("Impersonate-User", "carol"), ("Impersonate-Group", "viewers"))
        is None
    )
    error = decided(bundle, HAL, ("Impersonate-User", "admin"), ("Impersonate-Group", "devs"))
    assert error is not None
    assert error.code == 403
    assert error.message == (
        'users "admin" is forbidden: User "hal" of tenant "acme" cannot impersonate '
        'resource "users" in API group "" in tenant "acme"'
    )
    assert error.details == {"name": "admin", "group": "", "kind": "users"}
    error = decided(
        bundle,
        HAL,
        ("Impersonate-User", "carol"),
        ("Impersonate-Group", "viewers"),
        ("Impersonate-Group", "admins"),
        ("Impersonate-Uid", "0"),
    )
    assert error is not None
    assert error.message.startswith('groups "admins" is forbidden: User "hal"')
    error = decided(bundle, HAL, ("Impersonate-User", "carol"), ("Impersonate-Uid", "0"))
    assert error is not None
    assert error.message.startswith('uids "0" is forbidden')
    assert 'in API group "authentication.k8s.io"' in error.message
    error = decided(bundle, HAL, ("Impersonate-User", "carol"), ("Impersonate-Extra-Scopes", "x"))
    assert error is not None
    assert error.message.startswith('userextras/scopes "x" is forbidden')


def test_no_grant_no_impersonation(bundle: PolicyBundle) -> None:
    error = decided(bundle, NOBODY, ("Impersonate-User", "nora"))
    assert error is not None
    assert error.code == 403


@pytest.mark.parametrize("tenant", ["beta", "system"])
def test_a_tenant_user_never_becomes_a_user_of_another_tenant(
    bundle: PolicyBundle, tenant: str
) -> None:
    """Whatever the policy says: alice administers acme, rita has a ClusterRoleBinding
    to impersonate anyone everywhere; a 403, not the 404 a concealed tenant gets."""
    for caller in (ALICE, RITA):
        error = decided(
            bundle, caller, ("Impersonate-User", "admin"), ("Impersonate-Extra-Tenant", tenant)
        )
        assert error is not None
        assert error.code == 403
        assert f'in tenant "{tenant}"' in error.message
        assert "can never become a user of another tenant" in error.message
    # rita's grant is good inside her own tenant.
    assert decided(bundle, RITA, ("Impersonate-User", "bob")) is None


def test_only_a_cluster_role_binding_reaches_across_tenants(bundle: PolicyBundle) -> None:
    """A system operator: through a ClusterRoleBinding into any tenant; through a
    binding of its own tenant, only users of `system`."""
    to_acme = (("Impersonate-User", "alice"), ("Impersonate-Extra-Tenant", "acme"))
    assert decided(bundle, ADMIN, *to_acme) is None
    error = decided(bundle, OLGA, *to_acme)
    assert error is not None
    assert error.code == 403
    assert error.message.startswith('users "alice" is forbidden: User "olga" of tenant "system"')
    assert decided(bundle, OLGA, ("Impersonate-User", "ops2")) is None
    # ... but not a system user a ClusterRoleBinding makes a cluster admin.
    escalation = decided(bundle, OLGA, ("Impersonate-User", "admin"))
    assert escalation is not None
    assert "ClusterRoleBinding admins names user 'admin'" in escalation.message


# -- PolicyTest cases -----------------------------------------------------------------------


def test_a_case_is_read_as_the_headers_kubectl_sends() -> None:
    spec = {
        "user": "vera",
        "groups": ["viewers", "auditors"],
        "uid": "42",
        "tenant": "acme",
        "extra": {"example.com/team": ["a", "b"]},
    }
    headers = case_headers(spec)
    assert ("Impersonate-Extra-example.com%2Fteam", "a") in headers
    assert parse_impersonation(headers) == Impersonation(
        "vera",
        ("viewers", "auditors"),
        "42",
        (("tenant", ("acme",)), ("example.com/team", ("a", "b"))),
    )
    with pytest.raises(ValueError, match="unknown field"):
        case_headers({"user": "vera", "as": "x"})
    with pytest.raises(ValueError, match="list of strings"):
        case_headers({"user": "vera", "groups": [1]})


def test_a_subject_bound_cluster_wide_takes_a_cluster_wide_grant(bundle: PolicyBundle) -> None:
    """Found by a hostile review: alice, an admin of acme by a TenantRoleBinding, got
    the cross-tenant grants of acme's group `node-auditors` (and of rita) by
    impersonating it. A subject a ClusterRoleBinding names is impersonated only under a
    cluster-wide grant."""
    for headers in (
        (("Impersonate-User", "vera"), ("Impersonate-Group", "node-auditors")),
        (("Impersonate-User", "rita"),),
    ):
        refused = decided(bundle, ALICE, *headers)
        assert refused is not None
        assert "only a cluster-wide grant may impersonate it" in refused.message
    # The cluster admin may; and alice may still become acme's other users and groups.
    assert (
        decided(bundle, ADMIN, ("Impersonate-User", "rita"), ("Impersonate-Extra-Tenant", "acme"))
        is None
    )
    assert (
        decided(bundle, ALICE, ("Impersonate-User", "vera"), ("Impersonate-Group", "devs")) is None
    )

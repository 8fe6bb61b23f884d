"""Access reviews with `*` (issue 29; DESIGN §3): verb, group or resource `*` is allowed
exactly when a rule with `*` in that place grants it, as Kubernetes' RBAC answers
`kubectl auth can-i '*' '*'`; a real request's own `*` stays literal and matches
nothing; and the review's "any" cannot be forged with a control character."""

from __future__ import annotations

import pytest

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.core.target import parse_target
from sidecar.edge.reviews import review_target
from sidecar.policy.decide import decide
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from tests.rigs import paths

ADMIN = Identity("root", "system", ("cluster-admins",), "test")
TENANT_ADMIN = Identity("alice", "acme", ("tenant-admins",), "test")
VIEWER = Identity("vera", "acme", ("viewers",), "test")
DEV = Identity("dave", "acme", ("developers",), "test")


@pytest.fixture(scope="module")
def bundle() -> PolicyBundle:
    b, problems = load_bundle([paths.SHIPPED_POLICIES])
    assert problems == []
    return b


def ask(bundle: PolicyBundle, who: Identity, verb: str, resource: str, group: str = "") -> bool:
    attrs = {"verb": verb, "resource": resource, "group": group, "namespace": "dev"}
    target = review_target({"resourceAttributes": attrs}, who.tenant)
    verdict = decide(bundle, who, target)
    return verdict.allowed


@pytest.mark.parametrize(
    ("who", "verb", "resource", "group", "allowed"),
    [
        (ADMIN, "*", "*", "", True),
        (ADMIN, "*", "*", "*", True),
        (TENANT_ADMIN, "*", "*", "", True),
        (TENANT_ADMIN, "*", "configmaps", "", True),
        (VIEWER, "*", "*", "", False),
        (VIEWER, "get", "*", "", False),  # its rules name resources: no `*` there
        (VIEWER, "*", "configmaps", "", False),  # nor verbs
        (VIEWER, "get", "configmaps", "", True),
        (DEV, "*", "*", "", False),
    ],
)
def test_a_wildcard_is_granted_by_a_wildcard_rule_only(
    bundle: PolicyBundle, who: Identity, verb: str, resource: str, group: str, allowed: bool
) -> None:
    assert ask(bundle, who, verb, resource, group) is allowed


def test_a_requests_own_star_is_literal(bundle: PolicyBundle) -> None:
    target = parse_target("GET", "/api/v1/tenants/acme/namespaces/dev/*")
    assert not decide(bundle, ADMIN, target).allowed


@pytest.mark.parametrize("field", ["verb", "resource", "group"])
def test_the_any_marker_cannot_be_sent(field: str) -> None:
    attrs = {"verb": "get", "resource": "pods", field: "\x00*"}
    with pytest.raises(StatusError) as caught:
        review_target({"resourceAttributes": attrs}, "acme")
    assert caught.value.code == 400

"""Hostile review of issue 29's wildcard access reviews (class 2, side paths): a review
whose group is `*` was always decided at the tenant level, so a tenant admin's
TenantRoleBinding `*` rule answered `allowed: true` for `update quotas acme`,
`delete tenants acme`, `create nodes` or `get clusterroles` (group `*`), while every
real request of that kind is refused (403/404: a tenant binding reaches the cluster
level through owner rules only). Found live against `sidecar demo` (alice's
`SelfSubjectAccessReview` said yes, `PUT /quota/v1/tenants/acme/servers` was 403).

A `*` group asks about every group: the review is cluster-level when the resource is
cluster-scoped (or stands for a tenant) in any group. Pure decisions against the
shipped policies: the review's verdict for group `*` is never more than the verdict
of the real request."""

from __future__ import annotations

import pytest

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope, parse_target
from sidecar.edge.reviews import review_target
from sidecar.policy.decide import decide
from sidecar.policy.isolation import QUOTA_GROUP
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from tests.rigs import paths

ALICE = Identity("alice", "acme", ("tenant-admins", "node-owners"), "test")
ADMIN = Identity("root", "system", ("cluster-admins",), "test")


@pytest.fixture(scope="module")
def bundle() -> PolicyBundle:
    b, problems = load_bundle([paths.SHIPPED_POLICIES])
    assert problems == []
    return b


def review(bundle: PolicyBundle, who: Identity, verb: str, resource: str, name: str) -> bool:
    attrs = {"verb": verb, "group": "*", "resource": resource, "name": name}
    return decide(bundle, who, review_target({"resourceAttributes": attrs}, who.tenant)).allowed


def quota_update(tenant: str) -> RequestTarget:
    """The target the quota API decides for `PUT /quota/v1/tenants/{tenant}/…`."""
    return RequestTarget(
        path=f"/quota/v1/tenants/{tenant}",
        verb="update",
        resource_request=True,
        api_group=QUOTA_GROUP,
        api_version="v1",
        scope=Scope.CLUSTER,
        tenant=tenant,
        resource="quotas",
        name=tenant,
    )


REAL = [
    ("update", "quotas", "acme", quota_update("acme")),
    ("delete", "tenants", "acme", parse_target("DELETE", "/api/v1/tenants/acme")),
    ("get", "tenants", "beta", parse_target("GET", "/api/v1/tenants/beta")),
    ("create", "nodes", "", parse_target("POST", "/api/v1/nodes")),
    ("update", "nodes", "node-b1", parse_target("PUT", "/api/v1/nodes/node-b1")),
    (
        "list",
        "clusterroles",
        "",
        parse_target("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles"),
    ),
]


@pytest.mark.parametrize(("verb", "resource", "name", "real"), REAL)
def test_a_star_group_review_says_no_when_the_real_request_is_refused(
    bundle: PolicyBundle, verb: str, resource: str, name: str, real: RequestTarget
) -> None:
    assert not decide(bundle, ALICE, real).allowed  # the real request: refused
    assert not review(bundle, ALICE, verb, resource, name)


@pytest.mark.parametrize(("verb", "resource", "name", "real"), REAL)
def test_a_cluster_admin_star_group_review_still_says_yes(
    bundle: PolicyBundle, verb: str, resource: str, name: str, real: RequestTarget
) -> None:
    assert decide(bundle, ADMIN, real).allowed
    assert review(bundle, ADMIN, verb, resource, name)


def test_a_star_group_review_of_a_namespaced_resource_stays_in_the_tenant(
    bundle: PolicyBundle,
) -> None:
    assert review(bundle, ALICE, "create", "configmaps", "")
    real = parse_target("POST", "/api/v1/tenants/acme/namespaces/default/configmaps")
    assert decide(bundle, ALICE, real).allowed


def test_the_scopes_table_knows_the_reviews_any_marker() -> None:
    from sidecar.policy import scopes
    from sidecar.policy.compile import ANY

    assert scopes._ANY_GROUP == ANY

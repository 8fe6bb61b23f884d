"""Access and identity reviews (sidecar/edge/reviews.py, DESIGN §5) through the real sidecar
process in front of the real store, with the shipped policies: the standard and the
tenant paths, yes and no answers, the official Python `kubernetes` client decoding
every answer, and bad input answered with a 400/405 Status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from tests.rigs import modes, paths, processes

kubernetes = pytest.importorskip("kubernetes")

TOKENS = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "alice", "user": "alice", "tenant": "acme", "groups": ["tenant-admins"]},
    {"token": "dave", "user": "dave", "tenant": "acme", "groups": ["developers"]},
    {"token": "oscar", "user": "oscar", "tenant": "acme", "groups": ["node-owners"]},
    {"token": "bob", "user": "bob", "tenant": "beta", "groups": []},
]
AUTHZ = "/apis/authorization.k8s.io/v1"
SSAR, SAR, SSRR = "selfsubjectaccessreviews", "subjectaccessreviews", "selfsubjectrulesreviews"
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


class Sidecar:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = urllib3.PoolManager()

    def call(
        self, token: str, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        resp = self.http.request(method, self.url + path, body=data, headers=headers)
        return resp.status, json.loads(resp.data) if resp.data else None

    def client(self, token: str) -> Any:
        config = kubernetes.client.Configuration(host=self.url)
        config.api_key = {"authorization": f"Bearer {token}"}
        return kubernetes.client.ApiClient(config)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    tmp: Path = tmp_path_factory.mktemp("reviews")
    store = processes.start_store(tmp)
    proc = processes.start_sidecar(
        tmp,
        {
            "upstream": store.url,
            "policies": str(paths.ROOT / "policies"),
            "identity": {"tokenFile": str(processes.write_tokens(tmp, TOKENS))},
            "reload": {"enabled": False},
        },
    )
    try:
        yield Sidecar(proc.url)
    finally:
        proc.stop()
        store.stop()


def access(namespace: str, verb: str, resource: str, **extra: str) -> dict[str, Any]:
    attrs = {"namespace": namespace, "verb": verb, "resource": resource, **extra}
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {k: v for k, v in attrs.items() if v}},
    }


@pytest.mark.parametrize("path", [f"{AUTHZ}/{SSAR}", f"{AUTHZ}/tenants/acme/{SSAR}"])
def test_self_access_review_yes_and_no(sidecar: Sidecar, path: str) -> None:
    review = access("dev", "list", "pods")
    status, body = sidecar.call("dave", "POST", path, review)
    assert status == 201, body
    assert body["kind"] == "SelfSubjectAccessReview"
    assert body["apiVersion"] == "authorization.k8s.io/v1"
    assert body["metadata"] == {"creationTimestamp": None}
    assert body["spec"] == review["spec"]
    assert body["status"]["allowed"] is True
    assert "RoleBinding acme/dev/developers" in body["status"]["reason"]
    assert "denied" not in body["status"]
    status, body = sidecar.call("dave", "POST", path, access("prod", "list", "pods"))
    assert status == 201
    assert body["status"]["allowed"] is False
    assert body["status"]["denied"] is True


def test_a_review_answers_what_the_request_would_get(sidecar: Sidecar) -> None:
    # The Tenant object of one's own tenant: 403, a review says no; non-resource URLs.
    assert sidecar.call("alice", "GET", "/api/v1/tenants/acme")[0] == 403
    review = {
        "spec": {"resourceAttributes": {"verb": "get", "resource": "tenants", "name": "acme"}}
    }
    status, body = sidecar.call("alice", "POST", f"{AUTHZ}/{SSAR}", review)
    assert status == 201
    assert body["status"]["allowed"] is False
    version = {"spec": {"nonResourceAttributes": {"path": "/version", "verb": "get"}}}
    status, body = sidecar.call("bob", "POST", f"{AUTHZ}/{SSAR}", version)
    assert status == 201
    assert body["status"]["allowed"] is True
    metrics = {"spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}
    status, body = sidecar.call("bob", "POST", f"{AUTHZ}/{SSAR}", metrics)
    assert status == 201
    assert body["status"]["allowed"] is False


@pytest.mark.parametrize(
    ("token", "verb", "tenant", "method", "path"),
    [
        ("dave", "get", "beta", "GET", "/quota/v1/tenants/beta"),
        ("dave", "get", "system", "GET", "/quota/v1/tenants/system"),
        ("dave", "get", "nosuch", "GET", "/quota/v1/tenants/nosuch"),
        ("alice", "update", "beta", "PUT", "/quota/v1/tenants/beta/servers"),
        ("alice", "update", "acme", "PUT", "/quota/v1/tenants/acme/servers"),
        ("dave", "get", "acme", "GET", "/quota/v1/tenants/acme"),
    ],
)
def test_a_quota_review_answers_what_the_quota_api_would(
    sidecar: Sidecar, token: str, verb: str, tenant: str, method: str, path: str
) -> None:
    """A tenant's quota is a cluster-level object named by the tenant (hostile review of
    issue 25: a review of `quotas/beta` was decided inside the caller's own tenant and
    said yes, while the real request is a 404)."""
    body = {"hard_limit": 1000} if method == "PUT" else None
    real, _ = sidecar.call(token, method, path, body)
    review = {
        "spec": {
            "resourceAttributes": {
                "verb": verb,
                "group": "quota.sidecar",
                "resource": "quotas",
                "name": tenant,
                "namespace": "dev",
            }
        }
    }
    status, answer = sidecar.call(token, "POST", f"{AUTHZ}/{SSAR}", review)
    assert status == 201, answer
    assert answer["status"]["allowed"] is (real < 400), (real, answer["status"])


def test_kubernetes_client_decodes_access_reviews(sidecar: Sidecar) -> None:
    models = kubernetes.client
    api = models.AuthorizationV1Api(sidecar.client("dave"))
    spec = models.V1SelfSubjectAccessReviewSpec(
        resource_attributes=models.V1ResourceAttributes(
            namespace="dev", verb="create", resource="deployments", group="apps"
        )
    )
    got = api.create_self_subject_access_review(models.V1SelfSubjectAccessReview(spec=spec))
    assert got.status.allowed is True
    assert got.spec.resource_attributes.namespace == "dev"
    spec.resource_attributes.verb = "deletecollection"
    got = api.create_self_subject_access_review(models.V1SelfSubjectAccessReview(spec=spec))
    assert got.status.allowed is False
    assert got.status.denied is True


def test_subject_access_review_needs_the_grant(sidecar: Sidecar) -> None:
    about_dave = {
        "spec": {
            "user": "dave",
            "groups": ["developers"],
            "resourceAttributes": {"namespace": "dev", "verb": "get", "resource": "pods"},
        }
    }
    # alice administers acme (her TenantRoleBinding grants every verb there).
    for path in (f"{AUTHZ}/{SAR}", f"{AUTHZ}/tenants/acme/{SAR}"):
        status, body = sidecar.call("alice", "POST", path, about_dave)
        assert status == 201, body
        assert body["kind"] == "SubjectAccessReview", body
        assert body["status"]["allowed"] is True
    nobody = {**about_dave, "spec": {**about_dave["spec"], "user": "mallory", "groups": []}}
    status, body = sidecar.call("alice", "POST", f"{AUTHZ}/{SAR}", nobody)
    assert status == 201
    assert body["status"] == {
        "allowed": False,
        "denied": True,
        "reason": body["status"]["reason"],
    }
    # dave may not ask about others; beta does not exist for alice.
    status, body = sidecar.call("dave", "POST", f"{AUTHZ}/{SAR}", about_dave)
    assert status == 403
    assert body["kind"] == "Status"
    status, body = sidecar.call("alice", "POST", f"{AUTHZ}/tenants/beta/{SAR}", about_dave)
    assert status == 404
    assert body["message"] == 'tenants "beta" not found'
    # The official client decodes it.
    models = kubernetes.client
    api = models.AuthorizationV1Api(sidecar.client("alice"))
    got = api.create_subject_access_review(
        models.V1SubjectAccessReview(
            spec=models.V1SubjectAccessReviewSpec(
                user="dave",
                groups=["developers"],
                resource_attributes=models.V1ResourceAttributes(
                    namespace="dev", verb="delete", resource="pods"
                ),
            )
        )
    )
    assert got.status.allowed is True


@pytest.mark.parametrize("path", [f"{AUTHZ}/{SSRR}", f"{AUTHZ}/tenants/acme/{SSRR}"])
def test_rules_review_lists_the_rules_in_force(sidecar: Sidecar, path: str) -> None:
    review: dict[str, Any] = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": "dev"},
    }
    status, body = sidecar.call("dave", "POST", path, review)
    assert status == 201, body
    assert body["kind"] == "SelfSubjectRulesReview", body
    st = body["status"]
    assert st["incomplete"] is False
    pods = [r for r in st["resourceRules"] if "pods" in r["resources"]]
    assert pods
    assert "delete" in pods[0]["verbs"]
    assert {"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"],
            "resourceNames": ["app-config"]} in st["resourceRules"]  # fmt: skip
    assert any("/version" in r["nonResourceURLs"] for r in st["nonResourceRules"])
    # Another namespace: none of dev's RoleBindings.
    review["spec"]["namespace"] = "prod"
    status, body = sidecar.call("dave", "POST", path, review)
    assert status == 201
    assert not [r for r in body["status"]["resourceRules"] if "pods" in r["resources"]]


def test_rules_review_leaves_owner_rules_out_and_decodes(sidecar: Sidecar) -> None:
    models = kubernetes.client
    api = models.AuthorizationV1Api(sidecar.client("oscar"))
    got = api.create_self_subject_rules_review(
        models.V1SelfSubjectRulesReview(spec=models.V1SelfSubjectRulesReviewSpec(namespace="dev"))
    )
    assert got.status.incomplete is False
    assert not [r for r in got.status.resource_rules if "nodes" in (r.resources or [])]
    assert got.status.non_resource_rules


def test_whoami(sidecar: Sidecar) -> None:
    status, body = sidecar.call(
        "dave",
        "POST",
        WHOAMI,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert status == 201, body
    assert body["kind"] == "SelfSubjectReview"
    assert body["metadata"] == {"creationTimestamp": None}
    assert body["status"]["userInfo"] == {
        "username": "dave",
        "groups": ["developers", "system:authenticated"],
        "extra": {"tenant": ["acme"]},
    }
    api = kubernetes.client.AuthenticationV1Api(sidecar.client("bob"))
    got = api.create_self_subject_review(kubernetes.client.V1SelfSubjectReview())
    assert got.status.user_info.username == "bob"
    assert got.status.user_info.extra == {"tenant": ["beta"]}


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        (f"{AUTHZ}/{SSAR}", {"spec": {}}, 400),  # neither kind of attributes
        (
            f"{AUTHZ}/{SSAR}",
            {
                "spec": {
                    "resourceAttributes": {"verb": "get", "resource": "pods"},
                    "nonResourceAttributes": {"verb": "get", "path": "/version"},
                }
            },
            400,
        ),
        (f"{AUTHZ}/{SSAR}", {"kind": "SubjectAccessReview", "spec": {}}, 400),
        (f"{AUTHZ}/{SSAR}", {"apiVersion": "v1", "spec": {}}, 400),
        (f"{AUTHZ}/{SSAR}", [1], 400),
        (f"{AUTHZ}/{SSAR}", {"spec": {"resourceAttributes": {"verb": "get"}}}, 400),
        (f"{AUTHZ}/{SSRR}", {"spec": {"namespace": "Not_A_Name"}}, 400),
        (f"{AUTHZ}/{SAR}", {"spec": {"resourceAttributes": {"verb": "get", "resource": "p"}}}, 400),
        (WHOAMI, {"kind": "SelfSubjectAccessReview"}, 400),
    ],
)
def test_bad_reviews_are_400(sidecar: Sidecar, path: str, body: Any, code: int) -> None:
    status, answer = sidecar.call("alice", "POST", path, body)
    assert status == code, answer
    assert answer["kind"] == "Status"
    assert answer["code"] == code


def test_malformed_json_and_wrong_method(sidecar: Sidecar) -> None:
    status, answer = sidecar.call("dave", "POST", f"{AUTHZ}/{SSAR}", raw=b'{"spec": ')
    assert status == 400
    assert answer["kind"] == "Status"
    status, answer = sidecar.call("dave", "GET", f"{AUTHZ}/{SSAR}")
    assert status == 405
    assert answer["kind"] == "Status"


def test_cluster_admin_reviews_are_answered_not_forwarded(sidecar: Sidecar) -> None:
    # Before, a cluster admin's review at the standard path reached the store.
    status, body = sidecar.call("admin", "POST", f"{AUTHZ}/{SSAR}", access("dev", "delete", "pods"))
    assert status == 201, body
    assert body["kind"] == "SelfSubjectAccessReview", body
    assert body["status"]["allowed"] is True
    assert "ClusterRoleBinding cluster-admins" in body["status"]["reason"]


@pytest.fixture(scope="module")
def dry_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """The shipped policies with acme in dry-run (a TenantMode), beta enforced."""
    tmp: Path = tmp_path_factory.mktemp("reviews-dry-run")
    policies, keys = modes.under("tenant-dry-run", tmp, paths.ROOT / "policies")
    store = processes.start_store(tmp)
    proc = processes.start_sidecar(
        tmp,
        {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(processes.write_tokens(tmp, TOKENS))},
            "reload": {"enabled": False},
            **keys,
        },
    )
    try:
        for tenant in ("acme", "beta"):
            status, body = Sidecar(proc.url).call(
                "admin", "POST", "/api/v1/tenants", {"metadata": {"name": tenant}}
            )
            assert status == 201, body
        yield Sidecar(proc.url)
    finally:
        proc.stop()
        store.stop()


def test_reviews_name_the_dry_run_and_keep_the_policy_answer(dry_sidecar: Sidecar) -> None:
    """Issue 22: a review says which mode is in force for its subject and what the live
    request gets; `status.allowed` stays the policy's answer."""
    status, body = dry_sidecar.call(
        "dave", "POST", f"{AUTHZ}/{SSAR}", access("dev", "list", "secrets")
    )
    assert status == 201, body
    assert body["status"]["allowed"] is False
    assert body["status"]["denied"] is True
    assert "(mode: dry-run (tenant acme): would deny, forwarded)" in body["status"]["reason"]
    # ... and the live request is forwarded indeed.
    assert dry_sidecar.call("dave", "GET", "/api/v1/namespaces/dev/secrets")[0] == 200
    # Not relaxed: a node it does not own (404 in every mode), live and reviewed.
    node = {"spec": {"resourceAttributes": {"verb": "patch", "resource": "nodes", "name": "n1"}}}
    status, body = dry_sidecar.call("oscar", "POST", f"{AUTHZ}/{SSAR}", node)
    assert body["status"]["allowed"] is False
    assert "not found (HTTP 404), not relaxed: concealment" in body["status"]["reason"]
    assert dry_sidecar.call("oscar", "GET", "/api/v1/nodes/n1")[0] == 404
    # A SubjectAccessReview names the mode of its subject's tenant.
    about_dave = {
        "spec": {"user": "dave", "groups": ["developers"],
                 "resourceAttributes": {"namespace": "dev", "verb": "delete", "resource": "secrets"}}
    }  # fmt: skip
    status, body = dry_sidecar.call("alice", "POST", f"{AUTHZ}/tenants/acme/{SAR}", about_dave)
    assert status == 201, body
    assert body["status"]["allowed"] is False
    assert "mode: dry-run (tenant acme)" in body["status"]["reason"]
    # beta is enforced: its reviews say nothing of a mode.
    status, body = dry_sidecar.call("bob", "POST", f"{AUTHZ}/{SSAR}", access("dev", "list", "pods"))
    assert body["status"]["allowed"] is False
    assert "mode" not in body["status"]["reason"]

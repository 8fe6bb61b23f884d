"""Property: the indexed engine decides exactly as a plain pycasbin Enforcer over the
same compiled model and policy lines (which scans every line)."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope
from sidecar.policy.compile import OWNED
from sidecar.policy.engine import PolicyEngine, compile_engine, request_vector, subject_keys
from sidecar.policy.source.files import parse_yaml_documents

TENANTS = ["acme", "beta"]
NAMESPACES = ["dev", "prod"]
USERS = ["alice", "bob", "*"]
GROUPS = ["devs", "system:authenticated"]
RESOURCES = ["pods", "pods/log", "nodes", "*", "*/log"]
API_GROUPS = ["", "apps", "*"]
VERBS = ["get", "list", "create", "update", "delete", "*"]
NAMES = ["a", "b"]
URLS = ["/healthz", "/debug/*", "*"]

rules = st.fixed_dictionaries(
    {
        "apiGroups": st.lists(st.sampled_from(API_GROUPS), min_size=1, max_size=2, unique=True),
        "resources": st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=3, unique=True),
        "verbs": st.lists(st.sampled_from(VERBS), min_size=1, max_size=3, unique=True),
    },
    optional={
        "resourceNames": st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True),
        "when": st.just("owner"),
    },
)
url_rules = st.fixed_dictionaries(
    {
        "nonResourceURLs": st.lists(st.sampled_from(URLS), min_size=1, max_size=2, unique=True),
        "verbs": st.lists(
            st.sampled_from(["get", "post", "*"]), min_size=1, max_size=2, unique=True
        ),
    }
)
subjects = st.one_of(
    st.fixed_dictionaries({"kind": st.just("User"), "name": st.sampled_from(USERS[:2])}),
    st.fixed_dictionaries({"kind": st.just("Group"), "name": st.sampled_from(GROUPS)}),
)


@st.composite
def policies(draw: Any) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        docs.append(
            {
                "kind": "ClusterRole",
                "metadata": {"name": f"c{i}"},
                "rules": draw(st.lists(rules | url_rules, min_size=1, max_size=3)),
            }
        )
    for i in range(draw(st.integers(0, 2))):
        t = draw(st.sampled_from(TENANTS))
        docs.append(
            {
                "kind": "TenantRole",
                "metadata": {"name": f"t{i}", "tenant": t},
                "rules": draw(st.lists(rules, min_size=1, max_size=2)),
            }
        )
    for i in range(draw(st.integers(2, 8))):
        kind = draw(st.sampled_from(["ClusterRoleBinding", "TenantRoleBinding", "RoleBinding"]))
        t, ns = draw(st.sampled_from(TENANTS)), draw(st.sampled_from(NAMESPACES))
        meta: dict[str, Any] = {"name": f"b{i}"}
        if kind != "ClusterRoleBinding":
            meta["tenant"] = t
        if kind == "RoleBinding":
            meta["namespace"] = ns
        candidates = [
            d
            for d in docs
            if d["kind"] == "ClusterRole"
            or (
                kind != "ClusterRoleBinding"
                and d["kind"] == "TenantRole"
                and d["metadata"].get("tenant") == t
            )
        ]
        role = draw(st.sampled_from(candidates))
        subs = draw(st.lists(subjects, min_size=1, max_size=2))
        if kind == "ClusterRoleBinding":
            subs = [
                dict(s, tenant=draw(st.sampled_from(TENANTS)))
                if s["name"] != "system:authenticated"
                else s
                for s in subs
            ]
        docs.append(
            {
                "kind": kind,
                "metadata": meta,
                "subjects": subs,
                "roleRef": {"kind": role["kind"], "name": role["metadata"]["name"]},
            }
        )
    return docs


@st.composite
def requests(draw: Any) -> tuple[Identity, RequestTarget]:
    identity = Identity(
        draw(st.sampled_from(USERS + USERS[:2])),
        draw(st.sampled_from(TENANTS)),
        tuple(draw(st.lists(st.sampled_from(GROUPS[:1]), max_size=1))),
    )
    if draw(st.integers(0, 9)) == 0:
        path = draw(st.sampled_from(["/healthz", "/debug/x", "/debugx", "/other"]))
        return identity, RequestTarget(
            path=path, verb=draw(st.sampled_from(["get", "post"])), resource_request=False
        )
    scope = draw(st.sampled_from(list(Scope)))
    resource = draw(st.sampled_from(["pods", "pods", "nodes", "nodes", "*", "p:ods", "pöds"]))
    sub = draw(st.sampled_from(["", "", "", "log", "*"]))
    return identity, RequestTarget(
        path="/x",
        verb=draw(st.sampled_from([*VERBS[:-1], "watch", "*"])),
        resource_request=True,
        api_group=draw(st.sampled_from(["", "", "apps", "*"])),
        api_version="v1",
        scope=scope,
        tenant=None if scope == Scope.CLUSTER else draw(st.sampled_from(TENANTS)),
        namespace=draw(st.sampled_from(NAMESPACES)) if scope == Scope.NAMESPACE else None,
        resource=resource,
        subresource=sub,
        name=draw(st.sampled_from(["", "a", "b", "*"])) if not sub else "a",
    )


@st.composite
def bound_requests(draw: Any, docs: list[dict[str, Any]]) -> tuple[Identity, RequestTarget]:
    """A request from a subject of one of the policy's bindings, inside its domain."""
    identity, target = draw(requests())
    binding = draw(st.sampled_from([d for d in docs if "subjects" in d]))
    subject = draw(st.sampled_from(binding["subjects"]))
    tenant = binding["metadata"].get("tenant") or subject.get("tenant") or identity.tenant
    user, groups = identity.user, identity.groups
    if subject["kind"] == "User":
        user = subject["name"]
    elif subject["name"] != "system:authenticated":
        groups = (subject["name"],)
    identity = Identity(user, tenant, groups)
    if target.resource_request and target.scope != Scope.CLUSTER:
        ns = binding["metadata"].get("namespace") or target.namespace
        target = dataclasses.replace(
            target, tenant=tenant, namespace=ns if target.scope == Scope.NAMESPACE else None
        )
    return identity, target


def _plain(enforcer: Any, identity: Identity, target: RequestTarget, own: str) -> bool:
    req = request_vector(identity, target)
    if isinstance(req, str):
        return False
    return any(enforcer.enforce(sub, *req[1:], own) for sub in subject_keys(identity))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies(), st.lists(requests(), min_size=2, max_size=8), st.data())
def test_indexed_engine_agrees_with_plain_enforcer(
    docs: list[dict[str, Any]], reqs: list[tuple[Identity, RequestTarget]], data: Any
) -> None:
    reqs = reqs + data.draw(st.lists(bound_requests(docs), min_size=4, max_size=10))
    text = yaml.safe_dump_all(docs, allow_unicode=True)
    parsed, problems = parse_yaml_documents(text, "gen.yaml")
    assert problems == []
    engine, problems = compile_engine(parsed, "rev")
    assert problems == [], [str(p) for p in problems]
    assert isinstance(engine, PolicyEngine)
    enforcer = engine.plain_enforcer()
    for identity, target in reqs:
        m = engine.match(identity, target)
        assert (m.unconditional is not None) == _plain(enforcer, identity, target, ""), target
        granted = m.unconditional is not None or bool(m.owner)
        assert granted == _plain(enforcer, identity, target, OWNED), target

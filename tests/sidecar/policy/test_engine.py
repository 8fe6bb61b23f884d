"""The engine's API and `decide()` over it: can_reach, the decision cache, odd inputs, rule
ids, `policy compile` and `policy explain` output."""

from __future__ import annotations

import argparse
import gc
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope, parse_target
from sidecar.policy.compile import format_compiled, print_compiled
from sidecar.policy.decide import decide
from sidecar.policy.engine import DecisionCache, PolicyEngine, compile_engine
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.source.files import parse_yaml_documents
from sidecar.policy.tools.explain import add_commands, evaluate_case, explain
from sidecar.services.metrics import Metrics
from tests.rigs import paths

CASES_DIR = paths.POLICY_CASES


@pytest.fixture(scope="module")
def bundle() -> PolicyBundle:
    b, problems = load_bundle([CASES_DIR])
    assert problems == []
    return b


def who(user: str, tenant: str, *groups: str) -> Identity:
    return Identity(user, tenant, groups)


def target(method: str, path: str) -> Any:
    raw, _, query = path.partition("?")
    return parse_target(method, raw, query)


def test_can_reach(bundle: PolicyBundle) -> None:
    e = bundle.engine
    # ClusterRoleBinding crosses tenants; any verb counts.
    assert e.can_reach(
        who("system:serviceaccount:ci:bot", "acme"),
        target("DELETE", "/api/v1/tenants/beta/namespaces/dev/pods/x"),
    )
    # A TenantRoleBinding never reaches another tenant.
    assert not e.can_reach(
        who("vera", "acme"), target("GET", "/api/v1/tenants/beta/namespaces/dev/pods")
    )
    # Cluster-scoped objects: through the tenant's own owner rules only.
    assert e.can_reach(who("o", "acme", "node-owners"), target("GET", "/api/v1/nodes/n1"))
    assert not e.can_reach(
        who("o", "acme", "node-owners"), target("GET", "/api/v1/persistentvolumes/p")
    )
    assert not e.can_reach(who("vera", "acme"), target("GET", "/api/v1/nodes"))
    assert e.can_reach(who("root", "system"), target("GET", "/api/v1/tenants/beta"))
    assert not e.can_reach(who("root", "acme"), target("GET", "/api/v1/tenants/beta"))


def test_rule_ids_are_file_and_line(bundle: PolicyBundle) -> None:
    ids = bundle.engine.rule_ids()
    assert ids
    assert all(i.rsplit(":", 1)[0].endswith("00-policy.yaml") for i in ids)
    d = decide(
        bundle, who("alice", "acme"), target("GET", "/api/v1/tenants/acme/namespaces/dev/pods")
    )
    assert d.outcome == "allow"
    assert d.rule_id in ids
    assert "RoleBinding acme/dev/dev-view" in d.reason
    assert "ClusterRole view" in d.reason
    assert d.revision == bundle.revision


@pytest.mark.parametrize("tenant", ["*", "", "ACME", "a/b", "acme:x"])
def test_invalid_caller_tenant_is_denied(bundle: PolicyBundle, tenant: str) -> None:
    d = decide(bundle, who("root", tenant, "operators"), target("GET", "/healthz"))
    assert d.outcome == "deny"


@pytest.mark.parametrize(
    "obj",
    [
        None,
        {},
        [],
        "acme",
        3,
        {"spec": None},
        {"spec": []},
        {"spec": {"owner": None}},
        {"spec": {"owner": {"name": "acme"}}},
        {"spec": {"owner": ["acme"]}},
        {"spec": {"owner": True}},
        {"spec": {"owner": ""}},
        {"spec": {"owner": "beta"}},
    ],
)
def test_odd_owner_values_are_notfound_not_errors(bundle: PolicyBundle, obj: Any) -> None:
    d = decide(bundle, who("o", "acme", "node-owners"), target("GET", "/api/v1/nodes/n1"), obj)
    assert d.outcome == "notfound"


def test_decision_cache_counts_and_keys(bundle: PolicyBundle) -> None:
    metrics = Metrics()
    cache = DecisionCache(100, metrics.count_decision_cache)
    e = bundle.engine
    alice, t = who("alice", "acme"), target("GET", "/api/v1/tenants/acme/namespaces/dev/pods")
    assert decide(e, alice, t, cache=cache).outcome == "allow"
    assert decide(e, alice, t, cache=cache).outcome == "allow"

    def count(result: str) -> float | None:
        name = "sidecar_decision_cache_total"
        return metrics.registry.get_sample_value(name, {"result": result})

    assert (count("hit"), count("miss")) == (1, 1)
    # Another revision is another key, even with the same documents.
    other = PolicyEngine("other-rev", e.policy, e.compiled)
    assert decide(other, alice, t, cache=cache).revision == "other-rev"
    assert count("miss") == 2
    # Groups are part of the key.
    assert decide(e, who("dan", "acme"), t, cache=cache).outcome == "deny"
    assert decide(e, who("dan", "acme", "devs"), t, cache=cache).outcome == "allow"
    # Owner-dependent decisions: the cached match, then the owner decides.
    node = target("GET", "/api/v1/nodes/n1")
    o = who("o", "acme", "node-owners")
    assert decide(e, o, node, {"spec": {"owner": "acme"}}, cache=cache).outcome == "allow"
    assert decide(e, o, node, {"spec": {"owner": "beta"}}, cache=cache).outcome == "notfound"
    assert decide(e, o, node, {"spec": {"owner": "acme"}}, cache=cache).outcome == "allow"


def _key_variants(
    e: PolicyEngine,
) -> list[tuple[str, PolicyEngine, Identity, RequestTarget, PolicyEngine, Identity, RequestTarget]]:
    """For every part of the decision-cache key, a base request and one that differs from
    it in that part alone: (part, base engine/identity/target, varied engine/identity/target)."""
    alice = who("alice", "acme", "devs")
    pods = target("GET", "/api/v1/tenants/acme/namespaces/dev/pods/p1")
    version = target("GET", "/version")
    assert pods.resource_request
    assert not version.resource_request
    assert pods.scope is Scope.NAMESPACE
    assert not pods.subresource
    other_rev = PolicyEngine("other-rev", e.policy, e.compiled)
    same = (e, alice, pods)
    return [
        ("revision", *same, other_rev, alice, pods),
        ("user", *same, e, who("bob", "acme", "devs"), pods),
        ("identity tenant", *same, e, who("alice", "beta", "devs"), pods),
        ("verb", *same, e, alice, replace(pods, verb="delete")),
        ("api group", *same, e, alice, replace(pods, api_group="apps")),
        ("resource", *same, e, alice, replace(pods, resource="services")),
        ("subresource", *same, e, alice, replace(pods, subresource="log")),
        ("name", *same, e, alice, replace(pods, name="p2")),
        ("scope", *same, e, alice, replace(pods, scope=Scope.TENANT)),
        ("target tenant", *same, e, alice, replace(pods, tenant="beta")),
        ("namespace", *same, e, alice, replace(pods, namespace="prod")),
        ("path", e, alice, version, e, alice, replace(version, path="/openapi/v2")),
        ("groups", *same, e, who("alice", "acme", "devs", "viewers"), pods),
    ]


def test_decision_cache_key_varies_with_every_part(bundle: PolicyBundle) -> None:
    """Each part of the key on its own makes another entry: a request that differs from a
    cached one in that part alone is a miss and gets its own decision, never the cached
    one's; the cached request is still a hit."""
    e = bundle.engine
    variants = _key_variants(e)
    # Every part of the key is varied: its fixed fields, then the groups (one part); the
    # resource and the subresource are one field (`full_resource`), varied each.
    fixed = len(DecisionCache.key(e, who("u", "t"), target("GET", "/version")))
    assert fixed == 11
    assert len(variants) == fixed + 1 + 1
    for part, e1, id1, t1, e2, id2, t2 in variants:
        assert DecisionCache.key(e1, id1, t1) != DecisionCache.key(e2, id2, t2), part
        cache = DecisionCache(100)
        first = decide(e1, id1, t1, cache=cache)
        assert first == decide(e1, id1, t1), part
        cached = len(cache)
        assert cached > 0, part
        varied = decide(e2, id2, t2, cache=cache)
        assert len(cache) > cached, f"{part}: the varied request was a cache hit"
        assert varied == decide(e2, id2, t2), part
        grown = len(cache)
        assert decide(e1, id1, t1, cache=cache) == first, part
        assert len(cache) == grown, f"{part}: the first request is no longer a hit"


def test_decision_cache_is_bounded(bundle: PolicyBundle) -> None:
    cache = DecisionCache(10)
    for i in range(50):
        decide(bundle, who(f"u{i}", "acme"), target("GET", "/healthz"), cache=cache)
    assert len(cache) == 10


def test_decision_cache_of_unknown_tenants_gives_the_collector_nothing_to_scan(
    bundle: PolicyBundle,
) -> None:
    """A flood of made-up tenants fills the cache with denials: their keys are plain
    strings (untracked by the garbage collector) and their values shared, so full
    collections do not grow with the number of tenants cached."""
    cache = DecisionCache(10_000)
    for i in range(2_000):
        tenant = f"made-up-{i}"
        caller = who("mallory", tenant, "developers")
        path = f"/api/v1/tenants/{tenant}/namespaces/dev/pods/x"
        assert decide(bundle, caller, target("GET", path), cache=cache).outcome != "allow"
    gc.collect()
    entries = list(cache._lru.items())
    assert len(entries) >= 2_000
    assert [key for key, _ in entries if gc.is_tracked(key)] == []
    assert len({id(value) for _, value in entries if gc.is_tracked(value)}) <= 1


def test_tenant_caller_cannot_forge_cross_tenant_group(bundle: PolicyBundle) -> None:
    # A group name that looks like another subject key stays inside the caller's tenant.
    d = decide(
        bundle,
        who("x", "acme", "system:operators", "*", "g:system:operators"),
        target("GET", "/api/v1/nodes"),
    )
    assert d.outcome == "notfound"
    assert d.isolated


def test_compile_output(bundle: PolicyBundle, capsys: pytest.CaptureFixture[str]) -> None:
    text = format_compiled(bundle.engine.compiled)
    assert text.startswith("[request_definition]")
    assert 'p, cr:view, res, "", "pods, services' not in text
    assert any(line.startswith("p, cr:view, res, ") for line in text.splitlines())
    assert any(
        line.startswith("g, g:system:operators, cr:cluster-admin, *") for line in text.splitlines()
    )
    assert print_compiled([str(CASES_DIR)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# revision ")
    assert "[matchers]" in out


def test_compile_reports_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.yaml").write_text(
        "kind: ClusterRoleBinding\nmetadata: {name: b}\n"
        "roleRef: {kind: ClusterRole, name: nope}\nsubjects: [{kind: User, name: u}]\n"
    )
    assert print_compiled([str(tmp_path)]) == 1
    assert "p.yaml:3: roleRef: ClusterRole 'nope' does not exist" in capsys.readouterr().err


def _cli(args: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    ns = parser.parse_args(args)
    result: int = ns.func(ns)
    return result


def test_explain_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code = _cli(
        [
            "explain",
            "--user",
            "o",
            "--tenant",
            "acme",
            "--group",
            "node-owners",
            "--object",
            '{"spec": {"owner": "acme"}}',
            "--json",
            "PATCH",
            "/api/v1/nodes/n1",
            str(CASES_DIR),
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {
        "target",
        "decision",
        "reason",
        "revision",
        "mode",
        "modeSource",
        "live",
        "modeNote",
    }
    assert set(out["target"]) == {
        "verb",
        "apiGroup",
        "apiVersion",
        "scope",
        "tenant",
        "namespace",
        "resource",
        "subresource",
        "name",
        "resourceRequest",
        "path",
    }
    assert out["decision"] == "allow"
    assert (out["mode"], out["modeSource"], out["live"]) == ("enforce", "global", "forwarded")
    assert out["target"]["scope"] == "cluster"
    assert "owner rule" in out["reason"]


def test_explain_text_and_bad_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _cli(
            [
                "explain",
                "--user",
                "alice",
                "--tenant",
                "acme",
                "GET",
                "/api/v1/namespaces/dev/pods",
                str(CASES_DIR),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "decision: allow" in out
    assert "tenant=acme" in out
    assert (
        _cli(
            [
                "explain",
                "--user",
                "a",
                "--tenant",
                "acme",
                "GET",
                "/api/v1/tenants/ACME/pods",
                str(CASES_DIR),
            ]
        )
        == 2
    )
    assert (
        _cli(
            [
                "explain",
                "--user",
                "a",
                "--tenant",
                "acme",
                "--object",
                "{",
                "GET",
                "/healthz",
                str(CASES_DIR),
            ]
        )
        == 2
    )


def test_explain_short_path_for_system_caller(bundle: PolicyBundle) -> None:
    out = explain(bundle, who("root", "system"), "GET", "/api/v1/namespaces/dev/pods")
    assert out["target"]["tenant"] == "default"
    assert out["decision"] == "allow"


def test_evaluate_case_errors(bundle: PolicyBundle) -> None:
    assert (
        evaluate_case(bundle, {"identity": {"user": "a"}, "request": {"path": "/x"}})[0] == "error"
    )
    assert (
        evaluate_case(
            bundle,
            {
                "identity": {"user": "a", "tenant": "acme"},
                "request": {"method": "GET", "path": "/api/v1/a//b"},
            },
        )[0]
        == "error"
    )
    got = evaluate_case(
        bundle,
        {
            "identity": {"user": "o", "tenant": "acme", "groups": ["node-owners"]},
            "request": {
                "method": "POST",
                "path": "/apis/baremetal/v1/tenants/acme/allocations",
                "body": "not json",
            },
        },
    )
    assert got[0] == "error"


def test_large_generated_policy_decides_by_index() -> None:
    # 2,000 tenants with their own bindings: a decision touches only the caller's lines.
    parts = [
        "kind: ClusterRole\nmetadata: {name: view}\nrules:\n- apiGroups: ['']\n"
        "  resources: [pods]\n  verbs: [get, list]\n"
    ]
    for i in range(2000):
        parts.append(
            f"kind: TenantRoleBinding\nmetadata: {{name: b, tenant: t{i}}}\n"
            "roleRef: {kind: ClusterRole, name: view}\n"
            "subjects: [{kind: User, name: u}]\n"
        )
    docs, problems = parse_yaml_documents("---\n".join(parts), "big.yaml")
    engine, problems = compile_engine(docs, "r")
    assert problems == []
    assert engine.line_count == 2001
    assert decide(
        engine, who("u", "t1999"), target("GET", "/api/v1/tenants/t1999/namespaces/x/pods")
    ).allowed
    assert not decide(
        engine, who("u", "t1999"), target("GET", "/api/v1/tenants/t1998/namespaces/x/pods")
    ).allowed

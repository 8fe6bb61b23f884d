"""`kind: RateLimit` documents: what they compile to, and every bad input with file:line."""

from __future__ import annotations

import textwrap

import pytest

from sidecar.policy.kinds.ratelimits import (
    DEFAULT_MAX_WATCHES,
    Rate,
    RateLimitPolicy,
    parse_rate_limits,
)
from sidecar.policy.source.files import parse_yaml_documents


def parse(text: str) -> tuple[RateLimitPolicy, list[str]]:
    docs, problems = parse_yaml_documents(textwrap.dedent(text), "rl.yaml")
    assert not problems
    policy, found = parse_rate_limits(docs)
    return policy, [str(p) for p in found]


def test_no_documents_means_not_configured_and_unlimited() -> None:
    policy, problems = parse("kind: ClusterRole\nmetadata: {name: x}\nrules: []\n")
    assert problems == []
    assert not policy.configured
    assert policy.for_tenant("acme") is None
    assert "not rate-limited" in policy.describe()


def test_default_and_override_with_reads_writes_users_inflight() -> None:
    policy, problems = parse(
        """\
        kind: RateLimit
        metadata: {name: default}
        spec: {tenant: "*", rate: 50, burst: 100, maxInFlight: 32,
               reads: {rate: 50, burst: 100}, writes: {rate: 10, burst: 20}}
        ---
        kind: RateLimit
        metadata: {name: acme}
        spec:
          tenant: acme
          rate: 5.5
          burst: 3
          users: {rate: 1, burst: 2}
        """
    )
    assert problems == []
    assert policy.configured
    default = policy.for_tenant("beta")
    assert default is not None
    assert default.max_in_flight == 32
    assert default.bucket_for("get") == ("reads", Rate(50.0, 100))
    assert default.bucket_for("create") == ("writes", Rate(10.0, 20))
    acme = policy.for_tenant("acme")
    assert acme is not None
    assert acme.bucket_for("list") == ("all", Rate(5.5, 3))
    assert acme.bucket_for("delete") == ("all", Rate(5.5, 3))
    assert acme.users == Rate(1.0, 2)
    assert acme.max_in_flight is None
    assert "1 tenant override" in policy.describe()


def test_max_watches_has_a_default_for_every_tenant() -> None:
    policy, problems = parse(
        """\
        kind: RateLimit
        spec: {tenant: acme, maxWatches: 7}
        ---
        kind: RateLimit
        spec: {tenant: beta, rate: 1, burst: 1}
        """
    )
    assert problems == []
    assert policy.max_watches("acme") == 7
    assert policy.max_watches("beta") == DEFAULT_MAX_WATCHES == 50
    assert policy.max_watches("gamma") == DEFAULT_MAX_WATCHES  # no document applies
    none, _ = parse("kind: ClusterRole\nmetadata: {name: x}\nrules: []\n")
    assert none.max_watches("acme") == DEFAULT_MAX_WATCHES
    assert "maxWatches 50" in none.describe()


def test_override_without_default_leaves_other_tenants_unlimited() -> None:
    policy, problems = parse("kind: RateLimit\nspec: {tenant: acme, rate: 1, burst: 1}\n")
    assert problems == []
    assert policy.configured
    assert policy.for_tenant("acme") is not None
    assert policy.for_tenant("beta") is None


@pytest.mark.parametrize(
    ("spec", "line", "needle"),
    [
        ("{rate: 0, burst: 1}", 3, "rate must be positive"),
        ("{rate: -2, burst: 1}", 3, "rate must be positive"),
        ("{rate: fast, burst: 1}", 3, "rate must be a number"),
        ("{rate: .nan, burst: 1}", 3, "rate must be positive"),
        ("{rate: 1, burst: 0}", 3, "burst must be at least 1"),
        ("{rate: 1, burst: 0.5}", 3, "burst must be at least 1"),
        ("{rate: 1, burst: -1}", 3, "burst must be at least 1"),
        ("{rate: 1, burst: lots}", 3, "burst must be a whole number"),
        ("{rate: 1, burst: 2.5}", 3, "burst must be a whole number"),
        ("{rate: 1, burst: true}", 3, "burst must be a whole number"),
        ("{rate: 1}", 3, "has 'rate' but no 'burst'"),
        ("{burst: 4}", 3, "has 'burst' but no 'rate'"),
        ("{rate: 1, burst: 1, brust: 3}", 3, "unknown field 'spec.brust'"),
        ("{rate: 1, burst: 1, maxInFlight: 0}", 3, "maxInFlight must be a whole number"),
        ("{rate: 1, burst: 1, maxInFlight: many}", 3, "maxInFlight must be a whole number"),
        ("{rate: 1, burst: 1, maxWatches: 0}", 3, "maxWatches must be a whole number"),
        ("{rate: 1, burst: 1, maxWatches: 2.5}", 3, "maxWatches must be a whole number"),
        ("{rate: 1, burst: 1, maxWatches: true}", 3, "maxWatches must be a whole number"),
        ("{rate: 1, burst: 1, reads: {rate: 0, burst: 1}}", 3, "spec.reads.rate must be positive"),
        ("{rate: 1, burst: 1, writes: {rate: 1}}", 3, "spec.writes has 'rate' but no 'burst'"),
        ("{rate: 1, burst: 1, users: {rate: 1, burst: 1, per: x}}", 3, "'spec.users.per'"),
        ("{rate: 1, burst: 1, users: 5}", 3, "spec.users must be a mapping"),
        ("{rate: 1, burst: 1, tenant: Not_A_Label}", 3, "spec.tenant must be"),
    ],
)
def test_bad_documents_give_file_and_line(spec: str, line: int, needle: str) -> None:
    _, problems = parse(f"kind: RateLimit\nmetadata: {{name: x}}\nspec: {spec}\n")
    assert problems, spec
    assert any(p.startswith(f"rl.yaml:{line}: ") and needle in p for p in problems), problems


def test_bad_value_points_at_its_own_line() -> None:
    _, problems = parse(
        """\
        kind: RateLimit
        metadata: {name: x}
        spec:
          tenant: acme
          rate: 10
          burst: 0
        """
    )
    assert problems == ["rl.yaml:6: spec.burst must be at least 1, not 0"]


def test_unknown_top_level_and_metadata_keys() -> None:
    _, problems = parse(
        """\
        kind: RateLimit
        metadata: {name: x, owner: me}
        spec: {rate: 1, burst: 1}
        extra: 1
        """
    )
    assert any(p.startswith("rl.yaml:4: ") and "unknown field 'extra'" in p for p in problems)
    assert any("unknown field 'metadata.owner'" in p for p in problems)


def test_missing_spec() -> None:
    _, problems = parse("kind: RateLimit\nmetadata: {name: x}\n")
    assert problems == ["rl.yaml:1: RateLimit needs a 'spec' mapping"]


@pytest.mark.parametrize("tenant", ['"*"', "acme"])
def test_two_documents_for_the_same_tenant(tenant: str) -> None:
    _, problems = parse(
        f"""\
        kind: RateLimit
        spec: {{tenant: {tenant}, rate: 1, burst: 1}}
        ---
        kind: RateLimit
        spec: {{tenant: {tenant}, rate: 2, burst: 2}}
        """
    )
    assert len(problems) == 1
    assert problems[0].startswith("rl.yaml:5: a second RateLimit for ")
    assert "the first is at rl.yaml:1" in problems[0]


def test_default_selector_is_implicit() -> None:
    _, problems = parse(
        """\
        kind: RateLimit
        spec: {rate: 1, burst: 1}
        ---
        kind: RateLimit
        spec: {tenant: "*", rate: 2, burst: 2}
        """
    )
    assert len(problems) == 1
    assert "the default" in problems[0]


def test_policy_check_rejects_bad_rate_limit(tmp_path: object) -> None:
    """The bundle (what `sidecar policy check` and reload use) carries the problem."""
    from pathlib import Path

    from sidecar.policy.source.bundle import load_bundle

    assert isinstance(tmp_path, Path)
    (tmp_path / "rl.yaml").write_text("kind: RateLimit\nspec: {rate: 0, burst: 1}\n")
    _, problems = load_bundle([tmp_path])
    assert [str(p) for p in problems] == [
        f"{tmp_path / 'rl.yaml'}:2: spec.rate must be positive, not 0"
    ]

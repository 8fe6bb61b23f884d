"""PolicyTest YAML cases in tests/policy_cases/, decided through `policy explain`'s code
path (`explain.evaluate_case`, the one decision function), as `sidecar policy test`
and the running sidecar decide them (tests/system/test_decision_consistency.py sends every
case through the real app too)."""

from __future__ import annotations

import pytest

from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.tools.explain import OUTCOMES, evaluate_case
from sidecar.policy.tools.testing import PolicyCase, default_evaluator, parse_tests, run_tests
from tests.rigs import paths

CASES_DIR = paths.POLICY_CASES


def _load() -> tuple[PolicyBundle, list[PolicyCase]]:
    bundle, problems = load_bundle([CASES_DIR])
    assert problems == [], [str(p) for p in problems]
    cases, problems = parse_tests(bundle.tests)
    assert problems == [], [str(p) for p in problems]
    return bundle, cases


BUNDLE, CASES = _load()
EVALUATE = default_evaluator()


def test_enough_cases_of_every_outcome() -> None:
    assert len(CASES) >= 80
    assert {c.expect for c in CASES} == OUTCOMES


@pytest.mark.parametrize("case", CASES, ids=[f"{c.where} {c.name}" for c in CASES])
def test_case(case: PolicyCase) -> None:
    actual, reason, rule_id = EVALUATE(BUNDLE, case)
    assert actual == case.expect, f"{case.where}: got {actual} ({reason})"
    if actual in ("allow", "filter"):
        assert rule_id in BUNDLE.engine.rule_ids()
    if actual == "notfound" and "owner rule" not in reason:
        # Concealment is presentation: with it off, the same request is a plain deny
        # (only an item an owner rule alone could reach stays 404, as in Ironic).
        assert evaluate_case(BUNDLE, case.as_mapping(), conceal=False)[0] == "deny"


def test_every_rule_is_exercised() -> None:
    report = run_tests(BUNDLE, CASES)
    assert report.uncovered == []

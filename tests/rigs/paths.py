"""Where things are: the repository root, the shipped policies, the test fixtures and the
PolicyTest cases under tests/ (one place, so a test file can move without its paths)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
POLICY_CASES = TESTS / "policy_cases"
SHIPPED_POLICIES = ROOT / "policies"

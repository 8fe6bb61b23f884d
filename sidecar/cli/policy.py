"""`sidecar policy …` commands: `check` and `test` here, `explain` and `compile` from
`sidecar.policy.tools.explain`.

- `check DIR…` prints every problem as `file:line: message` (all of them, one run)
  and exits 1 if there is any; warnings (`file:line: WARNING: …`) are printed too but
  never change the exit status unless `--strict`; lint warnings (unbound roles, empty
  roles, shadowed rules, grants to every tenant's users, dry-run TenantModes, …:
  `checks.lint`, `checks.mode_warnings`) go to stderr, and only for a valid tree.
- `test DIR…` runs every `PolicyTest` case, prints one line per failing case
  (expected vs actual and the reason), the summary `N passed, M failed`, and the
  rules no case exercised; exits 1 on a failure, a policy problem, or no cases.
  A case the policy refuses but whose caller's mode (`--mode`, the config's global
  mode, or a `TenantMode`) forwards anyway is listed too (`…: live: …`), so a mode
  change shows in the test run; it does not fail the run (`policy diff` and `check
  --strict` do).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sidecar.core.status import StatusError
from sidecar.core.target import TargetError
from sidecar.policy.kinds.modes import ENFORCE, MODES, describe, forwards, mode_for, mode_source
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.source.files import Problem
from sidecar.policy.tools import apisource, diff, explain, whocan
from sidecar.policy.tools.checks import cross_document_problems, lint, mode_warnings, warnings
from sidecar.policy.tools.explain import case_verdict
from sidecar.policy.tools.testing import PolicyCase, parse_tests, run_tests


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser(
        "check",
        help="validate policy directories",
        description="Validate policy files; prints 'file:line: message' per problem.",
    )
    check.add_argument("dirs", nargs="+", metavar="DIR")
    check.add_argument("--strict", action="store_true", help="warnings fail the check too")
    check.set_defaults(func=_check)

    test = sub.add_parser(
        "test",
        help="run the PolicyTest suites in policy directories",
        description="Run every PolicyTest case against the policy in the same directories.",
    )
    test.add_argument("dirs", nargs="+", metavar="DIR")
    test.add_argument(
        "--fail-uncovered",
        action="store_true",
        help="also exit non-zero when some rule is exercised by no test case",
    )
    test.add_argument("-v", "--verbose", action="store_true", help="print passing cases too")
    test.add_argument(
        "--mode",
        choices=MODES,
        default=ENFORCE,
        help="the config's global mode (a TenantMode overrides it for its tenant)",
    )
    test.set_defaults(func=_test)

    explain.add_commands(sub)
    diff.add_command(sub)
    whocan.add_commands(sub)
    apisource.add_dump_command(sub)


def validate(dirs: Sequence[str]) -> tuple[PolicyBundle, list[Problem], list[PolicyCase]]:
    """Everything `check` reports: per-kind problems, cross-document problems and
    malformed test cases; also returns the bundle and the well-formed cases."""
    bundle, problems = load_bundle(dirs)
    cases, test_problems = parse_tests(bundle.documents)
    all_problems = set(problems) | set(test_problems)
    all_problems |= set(cross_document_problems(bundle.documents))
    ordered = sorted(all_problems, key=lambda p: (p.file, p.line, p.message))
    return bundle, ordered, cases


def _check(args: argparse.Namespace) -> int:
    bundle, problems, _ = validate(args.dirs)
    for p in problems:
        print(p)
    found = warnings(bundle.documents)
    for w in found:
        print(w)
    if not problems:
        # Lint reads the compiled policy, which a broken tree does not give whole (a
        # dropped binding would make its role look unbound). Its warnings go to stderr,
        # with the summary, so stdout stays `file:line` problems and rule warnings.
        linted = lint(bundle.engine.policy) + mode_warnings(bundle.documents)
        for w in linted:
            print(w, file=sys.stderr)
        found += linted
    if problems:
        print(f"{len(problems)} problem(s)", file=sys.stderr)
        return 1
    if found and args.strict:
        print(f"{len(found)} warning(s) (--strict)", file=sys.stderr)
        return 1
    print(f"ok: {len(bundle.documents)} documents, revision {bundle.revision}", file=sys.stderr)
    return 0


def _test(args: argparse.Namespace) -> int:
    bundle, problems, cases = validate(args.dirs)
    if problems:
        for p in problems:
            print(p)
        print(f"{len(problems)} policy problem(s); fix them before testing", file=sys.stderr)
        return 1
    report = run_tests(bundle, cases)
    for result in report.results:
        if not result.passed:
            print(result.failure_line())
        elif args.verbose:
            print(f"{result.case.where}: ok {result.case.name} ({result.actual})")
    relaxed = _relaxed_cases(bundle, cases, args.mode)
    for line in relaxed:
        print(line)
    if relaxed:
        print(f"{len(relaxed)} refused case(s) are forwarded live by their caller's mode")
    for rule in report.uncovered:
        print(f"untested rule: {rule}")
    if report.uncovered:
        print(f"{len(report.uncovered)} rule(s) not exercised by any test case")
    print(report.summary())
    if not report.results:
        print("no PolicyTest cases found", file=sys.stderr)
        return 1
    if report.failed:
        return 1
    if args.fail_uncovered and report.uncovered:
        return 1
    return 0


def _relaxed_cases(
    bundle: PolicyBundle, cases: Sequence[PolicyCase], global_mode: str
) -> list[str]:
    """One line per case the policy refuses and its caller's mode forwards anyway."""
    out: list[str] = []
    for case in cases:
        mode = mode_for(global_mode, bundle.tenant_modes, case.tenant)
        try:
            v = case_verdict(bundle, case.as_mapping())
        except (ValueError, TargetError, StatusError):
            continue  # reported as a failing case
        if not v.allowed and forwards(v, mode):
            note = describe(mode, mode_source(bundle.tenant_modes, case.tenant), v)
            out.append(f"{case.where}: live: {case.name}: expects {case.expect}; mode {note}")
    return out

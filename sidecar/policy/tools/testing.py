"""`kind: PolicyTest` suites: parsing, validation, the runner and rule coverage.

A suite is a list of cases, each an identity, a request and the expected outcome:

    kind: PolicyTest
    metadata: {name: acme developers}
    cases:
    - name: alice lists servers in dev
      identity: {user: alice, tenant: acme, groups: [devs]}
      request: {method: GET, path: /apis/compute/v1/tenants/acme/namespaces/dev/servers}
      object: null          # the stored object, for owner rules (optional)
      expect: allow         # allow | deny | filter | notfound

A case may have the caller impersonate someone (`kubectl --as`, DESIGN §4):
`impersonate: {user, groups?, uid?, tenant?, extra?}` (`tenant` is
`Impersonate-Extra-Tenant`). A refused impersonation is `deny`; an allowed one decides
the request as the impersonated identity (`sidecar.policy.kinds.impersonation`).

Cases are decided by the one decision function the running sidecar uses
(`explain.evaluate_case` → `decide.decide`, isolation included), so an expected
`notfound` is the sidecar's 404 and `deny` its 403. Coverage: every rule the policy compiles to has
a stable id; a rule that allowed no case is reported as untested.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.policy.source.bundle import PolicyBundle
from sidecar.policy.source.files import Document, Node, NodeList, Problem

TEST_KIND = "PolicyTest"
OUTCOMES = ("allow", "deny", "filter", "notfound")
# The quota API (/quota/v1/...) is authorized as this group's cluster-scoped `quotas`;
# test cases address it as /apis/quota.sidecar/v1/quotas[/TENANT].
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

_TOP_FIELDS = frozenset({"apiVersion", "kind", "metadata", "cases"})
_META_FIELDS = frozenset({"name", "annotations", "labels"})
_CASE_FIELDS = frozenset({"name", "identity", "impersonate", "request", "object", "expect"})
_IDENTITY_FIELDS = frozenset({"user", "tenant", "groups"})
_REQUEST_FIELDS = frozenset({"method", "path", "body"})

# (bundle, case) -> (actual outcome, reason, rule id that allowed it or "")
Evaluator = Callable[[PolicyBundle, "PolicyCase"], tuple[str, str, str]]


@dataclass(frozen=True)
class PolicyCase:
    name: str
    user: str
    tenant: str
    groups: tuple[str, ...]
    method: str
    path: str
    expect: str
    body: Any = None
    object: Any = None
    # `impersonate: {user, groups, uid, tenant, extra}`, when the case has one.
    impersonate: Any = None
    suite: str = ""
    file: str = ""
    line: int = 0

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def identity(self) -> dict[str, Any]:
        return {"user": self.user, "tenant": self.tenant, "groups": list(self.groups)}

    @property
    def request(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "path": self.path}
        if self.body is not None:
            out["body"] = self.body
        return out

    def as_mapping(self) -> dict[str, Any]:
        """The case in its YAML shape (what `explain.evaluate_case` reads)."""
        out = {
            "name": self.name,
            "identity": self.identity,
            "request": self.request,
            "object": self.object,
            "expect": self.expect,
        }
        if self.impersonate is not None:
            out["impersonate"] = self.impersonate
        return out


@dataclass(frozen=True)
class CaseResult:
    case: PolicyCase
    actual: str
    reason: str
    rule_id: str
    # The evaluation raised (a bug in the engine, reported as outcome "error").
    crashed: bool = False

    @property
    def passed(self) -> bool:
        return self.actual == self.case.expect

    def failure_line(self) -> str:
        c = self.case
        return (
            f"{c.where}: FAIL {c.suite + ': ' if c.suite else ''}{c.name}: "
            f"expected {c.expect}, got {self.actual} ({self.reason})"
        )


@dataclass
class TestReport:
    results: list[CaseResult] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)

    __test__ = False  # not a pytest class

    @property
    def passed(self) -> int:
        return sum(1 for r in self.results if r.passed)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    def summary(self) -> str:
        return f"{self.passed} passed, {self.failed} failed"


def parse_tests(docs: Iterable[Document]) -> tuple[list[PolicyCase], list[Problem]]:
    """Every case of every PolicyTest document, and the problems of malformed ones."""
    cases: list[PolicyCase] = []
    problems: list[Problem] = []
    for doc in docs:
        if doc.kind != TEST_KIND:
            continue
        body = doc.body
        for key in body:
            if key not in _TOP_FIELDS:
                problems.append(doc.problem(f"unknown field {key!r} in PolicyTest", body, key))
        meta = body.get("metadata")
        suite = ""
        if meta is not None:
            if not isinstance(meta, Node):
                problems.append(doc.problem("metadata must be a mapping", body, "metadata"))
            else:
                for key in meta:
                    if key not in _META_FIELDS:
                        problems.append(doc.problem(f"unknown field 'metadata.{key}'", meta, key))
                name = meta.get("name")
                suite = name if isinstance(name, str) else ""
        raw_cases = body.get("cases")
        if not isinstance(raw_cases, NodeList) or not raw_cases:
            problems.append(doc.problem("PolicyTest needs a non-empty list 'cases'", body, "cases"))
            continue
        for i, raw in enumerate(raw_cases):
            case = _parse_case(doc, raw_cases, i, raw, suite, problems)
            if case is not None:
                cases.append(case)
    return cases, problems


def _parse_case(
    doc: Document,
    parent: NodeList,
    index: int,
    raw: Any,
    suite: str,
    problems: list[Problem],
) -> PolicyCase | None:
    line = parent.line_of(index)
    if not isinstance(raw, Node):
        problems.append(Problem(doc.file, line, f"case {index + 1} must be a mapping"))
        return None
    label = raw.get("name") if isinstance(raw.get("name"), str) else f"case {index + 1}"
    before = len(problems)

    def bad(message: str, node: Any = raw, key: str | None = None) -> None:
        problems.append(doc.problem(f"{label}: {message}", node, key))

    for key in raw:
        if key not in _CASE_FIELDS:
            bad(f"unknown field {key!r} in a test case", raw, key)
    if not isinstance(raw.get("name"), str) or not raw.get("name"):
        bad("a test case needs a 'name'", raw, "name")
    identity = raw.get("identity")
    user = tenant = ""
    groups: tuple[str, ...] = ()
    if not isinstance(identity, Node):
        bad("a test case needs 'identity: {user, tenant, groups?}'", raw, "identity")
    else:
        for key in identity:
            if key not in _IDENTITY_FIELDS:
                bad(f"unknown field 'identity.{key}'", identity, key)
        u, t, g = identity.get("user"), identity.get("tenant"), identity.get("groups", [])
        if not isinstance(u, str) or not u:
            bad("identity.user must be a non-empty string", identity, "user")
        else:
            user = u
        if not isinstance(t, str) or not t:
            bad("identity.tenant must be a non-empty string", identity, "tenant")
        else:
            tenant = t
        if g is None:
            g = []
        if not isinstance(g, list) or not all(isinstance(x, str) for x in g):
            bad("identity.groups must be a list of strings", identity, "groups")
        else:
            groups = tuple(g)
    impersonate = raw.get("impersonate")
    if impersonate is not None and not isinstance(impersonate, Node):
        bad(
            "impersonate must be a mapping {user, groups?, uid?, tenant?, extra?}",
            raw,
            "impersonate",
        )
    request = raw.get("request")
    method = path = ""
    body: Any = None
    if not isinstance(request, Node):
        bad("a test case needs 'request: {method, path, body?}'", raw, "request")
    else:
        for key in request:
            if key not in _REQUEST_FIELDS:
                bad(f"unknown field 'request.{key}'", request, key)
        m, p = request.get("method"), request.get("path")
        if not isinstance(m, str) or m.upper() not in METHODS:
            bad(f"request.method must be one of {', '.join(sorted(METHODS))}", request, "method")
        else:
            method = m.upper()
        if not isinstance(p, str) or not p.startswith("/"):
            bad("request.path must be an absolute path starting with '/'", request, "path")
        else:
            path = p
        body = request.get("body")
    expect = raw.get("expect")
    if expect not in OUTCOMES:
        bad(f"expect must be one of {', '.join(OUTCOMES)}, not {expect!r}", raw, "expect")
    if len(problems) > before:
        return None
    return PolicyCase(
        name=str(raw["name"]),
        user=user,
        tenant=tenant,
        groups=groups,
        method=method,
        path=path,
        expect=str(expect),
        body=_plain(body),
        object=_plain(raw.get("object")),
        impersonate=_plain(impersonate),
        suite=suite,
        file=doc.file,
        line=line,
    )


def _plain(value: Any) -> Any:
    """YAML nodes as plain dicts/lists (what JSON decoding of a real body gives)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def default_evaluator(conceal: bool = True) -> Evaluator:
    """Decide a case with the running sidecar's decision function."""
    from sidecar.policy.tools.explain import evaluate_case

    def evaluate(bundle: PolicyBundle, case: PolicyCase) -> tuple[str, str, str]:
        actual, reason, rule_id = evaluate_case(bundle, case.as_mapping(), conceal)
        return str(actual), str(reason), str(rule_id or "")

    return evaluate


def rule_ids(bundle: PolicyBundle) -> list[str]:
    engine: Any = bundle.engine
    ids = getattr(engine, "rule_ids", None)
    if not callable(ids):
        return []
    return sorted({str(i) for i in ids()})


def run_tests(
    bundle: PolicyBundle,
    cases: Sequence[PolicyCase],
    evaluate: Evaluator | None = None,
) -> TestReport:
    """Decide every case; a case whose evaluation raises fails with the error as reason."""
    evaluate = evaluate or default_evaluator()
    report = TestReport()
    exercised: set[str] = set()
    for case in cases:
        crashed = False
        try:
            actual, reason, rule_id = evaluate(bundle, case)
        except Exception as exc:  # a test runner reports, it does not crash
            actual, reason, rule_id = "error", f"{type(exc).__name__}: {exc}", ""
            crashed = True
        report.results.append(CaseResult(case, actual, reason, rule_id, crashed))
        if rule_id:
            exercised.add(rule_id)
    report.uncovered = [r for r in rule_ids(bundle) if r not in exercised]
    return report

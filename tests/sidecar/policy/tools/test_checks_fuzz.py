"""Whatever is in the policy directory, `check`/`test` validation and the reloader's
load never raise: every bad input becomes a `file:line: message` problem."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.cli.policy import validate
from sidecar.policy.source.store import PolicyStore
from sidecar.policy.tools.testing import run_tests

KINDS = [
    "ClusterRole",
    "TenantRole",
    "Role",
    "ClusterRoleBinding",
    "TenantRoleBinding",
    "RoleBinding",
    "RateLimit",
    "QuotaDefaults",
    "TenantResourceQuota",
    "ResourceQuota",
    "TenantMode",
    "PolicyTest",
    "Bogus",
]
KEYS = [
    "kind",
    "metadata",
    "name",
    "tenant",
    "namespace",
    "rules",
    "verbs",
    "resources",
    "apiGroups",
    "roleRef",
    "subjects",
    "spec",
    "mode",
    "cases",
    "identity",
    "request",
    "expect",
    "when",
    "hard",
    "rate",
    "burst",
    "method",
    "path",
    "user",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True),
    st.sampled_from(
        KINDS
        + KEYS
        + [
            "*",
            "",
            "acme",
            "get",
            "owner",
            "GET",
            "/api/v1/pods",
            "allow",
            "dry-run",
            "system:authenticated",
        ]
    ),
    st.text(max_size=8),
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    ),
    max_leaves=25,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=6).flatmap(
    lambda d: st.sampled_from(KINDS).map(lambda k: {**d, "kind": k})
)


def check_dir(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, data in files.items():
            (root / name).write_bytes(data)
        bundle, problems, cases = validate([tmp])
        for p in problems:
            assert isinstance(p.message, str)
            assert p.message
            assert p.file.startswith(tmp)
        if not problems:
            report = run_tests(bundle, cases)
            assert report.passed + report.failed == len(cases)
            crashes = [(r.case, r.reason) for r in report.results if r.crashed]
            assert crashes == []
        # The reloader's load path: never raises either.
        try:
            store = PolicyStore([tmp])
        except Exception as exc:  # only the documented start-up refusal
            assert type(exc).__name__ == "PolicyLoadError"  # noqa: PT017 (either outcome is allowed; pytest.raises cannot say that)
        else:
            assert store.reload() in (True, False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents, min_size=1, max_size=4))
def test_random_documents_never_crash(docs: list[dict[str, Any]]) -> None:
    text = yaml.safe_dump_all(docs)
    check_dir({"p.yaml": text.encode()})


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data: bytes) -> None:
    check_dir({"p.yaml": data, "q.yml": b"kind: ClusterRole\nmetadata: {name: ok}\n"})


case_values = st.one_of(
    values,
    st.fixed_dictionaries(
        {
            "name": st.text(min_size=1, max_size=5),
            "identity": st.fixed_dictionaries(
                {
                    "user": st.sampled_from(["u", "admin"]),
                    "tenant": st.sampled_from(["acme", "system", "Bad"]),
                    "groups": st.lists(st.sampled_from(["g", "devs"])),
                }
            ),
            "request": st.fixed_dictionaries(
                {
                    "method": st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
                    "path": st.one_of(
                        st.sampled_from(
                            [
                                "/api/v1/nodes",
                                "/api/v1/tenants/acme/namespaces/dev/pods",
                                "/api/v1/namespaces/dev/pods/p",
                                "/version",
                                "/apis//x",
                                "/api/v1/tenants/acme/%zz",
                                "/apis/baremetal/v1/tenants/acme/allocations",
                            ]
                        ),
                        st.text(max_size=12).map(lambda t: "/" + t),
                    ),
                    "body": values,
                }
            ),
            "object": values,
            "expect": st.sampled_from(["allow", "deny", "filter", "notfound"]),
        }
    ),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(case_values, min_size=1, max_size=5))
def test_random_test_cases_never_crash_the_runner(cases: list[Any]) -> None:
    roles = (
        "kind: ClusterRole\nmetadata: {name: r}\nrules:\n"
        "- {apiGroups: ['*'], resources: ['*'], verbs: [get, list, create]}\n"
        "- {apiGroups: [''], resources: [nodes], verbs: [get, list, update], when: owner}\n"
        "---\nkind: TenantRoleBinding\nmetadata: {name: b, tenant: acme}\n"
        "roleRef: {kind: ClusterRole, name: r}\nsubjects: [{kind: Group, name: devs}]\n"
    )
    suite = yaml.safe_dump({"kind": "PolicyTest", "cases": cases})
    check_dir({"roles.yaml": roles.encode(), "suite.yaml": suite.encode()})

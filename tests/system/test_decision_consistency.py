"""One decision path (issue 13): every PolicyTest case of `policies/tests/` and
`tests/policy_cases/` decided by `policy test` (`explain.evaluate_case`) and sent
through the real in-process sidecar app in front of a small fake upstream must agree:
allow → answered 2xx (forwarded, or answered by the sidecar's own API: reviews, quota,
/metrics), filter → forwarded with the owner filter (a list's `?owner=`, a create's
owner filled in), deny → 403, notfound → 404, neither of them forwarded. A case with
`impersonate:` is sent with the `Impersonate-*` headers `kubectl --as` would send.

The fake upstream answers the sidecar's own reads (owner lookups, tenant checks) with
the case's `object` (404 when the case has none) and every forwarded request with
200/201. The owner cache is off, so each case's object is read anew. An update of a
quota-tracked object is forwarded twice: first as the quota stage's dry run (DESIGN §7:
the same request with `dryRun=All`), then as itself, unchanged; the dry run is not
counted as the one forwarded request.

And again with the global mode `dry-run` (issue 22): a refusal the verdict says a mode
may relax (`Verdict.relaxable`, what `policy explain` reports as `live: forwarded`) is
forwarded, with the checked body when the verdict has one; every other refusal gets
exactly its 403/404 and is not forwarded, as in enforce mode."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from sidecar.app import build_app
from sidecar.config.settings import load_config
from sidecar.policy.decision import Verdict
from sidecar.policy.kinds.impersonation import case_headers
from sidecar.policy.kinds.modes import MODES, forwards, mode_for
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.tools.explain import case_verdict, evaluate_case
from sidecar.policy.tools.testing import PolicyCase, parse_tests
from tests.rigs import paths

ROOT = paths.ROOT
DIRS = {"shipped": ROOT / "policies", "cases": ROOT / "tests" / "policy_cases"}
QUOTA_PREFIX = "/apis/quota.sidecar/v1/quotas"
REVIEW_BODY = {"spec": {"user": "x", "nonResourceAttributes": {"path": "/version", "verb": "get"}}}


@dataclass
class FakeUpstream:
    """Answers what the sidecar reads itself from `obj`; records forwarded requests."""

    obj: Any = None
    forwarded: list[tuple[str, str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if "X-Forwarded-For" not in request.headers:  # the sidecar's own read
            if isinstance(self.obj, dict):  # versioned, as a real store's objects are
                meta = self.obj.get("metadata")
                meta = {"resourceVersion": "1", **(meta if isinstance(meta, dict) else {})}
                return web.json_response({**self.obj, "metadata": meta})
            if self.obj is not None:
                return web.json_response(self.obj)
            parts = request.path.strip("/").split("/")
            if parts[:3] == ["api", "v1", "tenants"] and len(parts) == 4:
                return web.json_response({"kind": "Tenant", "metadata": {"name": parts[3]}})
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        body = json.loads(raw) if raw else None
        self.forwarded.append((request.method, request.path_qs, body))
        if request.method == "GET" and self.obj is None:
            return web.json_response({"kind": "List", "metadata": {}, "items": []})
        if request.method == "GET":
            return web.json_response(self.obj)
        answer = dict(body) if isinstance(body, dict) else {}
        # A resourceVersion as a real store's answers carry (issue 28: a charged
        # update's real write holds its dry run's version).
        meta = answer.get("metadata")
        answer["metadata"] = {**(meta if isinstance(meta, dict) else {}), "resourceVersion": "1"}
        return web.json_response(answer, status=201 if request.method == "POST" else 200)


def _cases(directory: Path) -> tuple[PolicyBundle, list[PolicyCase]]:
    bundle, problems = load_bundle([directory])
    assert problems == [], [str(p) for p in problems]
    cases, problems = parse_tests(bundle.tests)
    assert problems == [], [str(p) for p in problems]
    assert cases, [str(p) for p in problems]
    return bundle, cases


def _identity(case: PolicyCase) -> tuple[str, str, tuple[str, ...]]:
    return (case.user, case.tenant, case.groups)


def _request(case: PolicyCase) -> tuple[str, str, Any, str]:
    """(method, path, body, content type) of the live request a case describes."""
    method, path, body = case.method, case.path, case.body
    if path.startswith(QUOTA_PREFIX):
        tenant = path[len(QUOTA_PREFIX) + 1 :]
        if not tenant:
            return method, "/quota/v1/quotas", None, ""
        if method == "PUT":
            body = {"hard_limit": 5}
            return method, f"/quota/v1/tenants/{tenant}/servers", body, "application/json"
        return method, f"/quota/v1/tenants/{tenant}", None, ""
    if "accessreviews" in path and body is None:
        body = REVIEW_BODY
    if body is None and method in ("POST", "PUT", "PATCH"):
        body = {}
    ctype = "application/json"
    if method == "PATCH":
        ctype = (
            "application/json-patch+json"
            if isinstance(body, list)
            else ("application/merge-patch+json")
        )
    return method, path, body, ctype


def _answered_by_sidecar(path: str) -> bool:
    return path.startswith("/quota/") or path == "/metrics" or "accessreviews" in path


@pytest.fixture(params=[(d, m) for d in sorted(DIRS) for m in MODES], ids="-".join)
async def rig(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[str, PolicyBundle, list[PolicyCase], FakeUpstream, str]]:
    name, mode = request.param
    bundle, cases = _cases(DIRS[name])
    identities = sorted({_identity(c) for c in cases})
    tokens = [
        {"token": f"tok{i}", "user": u, "tenant": t, "groups": list(g)}
        for i, (u, t, g) in enumerate(identities)
    ]
    token_file = tmp_path / "tokens.yaml"
    token_file.write_text(yaml.safe_dump(tokens))
    fake = FakeUpstream()
    up_app = web.Application()
    up_app.router.add_route("*", "/{tail:.*}", fake.handle)
    upstream = TestServer(up_app, host="127.0.0.1")
    await upstream.start_server()
    config = load_config(
        None,
        env={},
        overrides={
            "upstream": f"http://127.0.0.1:{upstream.port}",
            "policies": str(DIRS[name]),
            "identity.tokenFile": str(token_file),
            "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
            "audit.path": str(tmp_path / "audit.log"),
            "reload.enabled": False,
            "cache.owners": 0,
            "mode": mode,
        },
    )
    sidecar = TestServer(build_app(config), host="127.0.0.1")
    await sidecar.start_server()
    try:
        yield f"http://127.0.0.1:{sidecar.port}", bundle, cases, fake, mode
    finally:
        await sidecar.close()
        await upstream.close()


async def test_every_policy_case_gets_the_same_answer_live(
    rig: tuple[str, PolicyBundle, list[PolicyCase], FakeUpstream, str],
) -> None:
    url, bundle, cases, fake, global_mode = rig
    token_of = {ident: f"tok{i}" for i, ident in enumerate(sorted({_identity(c) for c in cases}))}
    mismatches: list[str] = []
    async with aiohttp.ClientSession() as http:
        for case in cases:
            actual, reason, _ = evaluate_case(bundle, case.as_mapping())
            assert actual == case.expect, f"{case.where}: policy test says {actual} ({reason})"
            verdict = case_verdict(bundle, case.as_mapping())
            mode = mode_for(global_mode, bundle.tenant_modes, case.tenant)
            relaxed = not verdict.allowed and forwards(verdict, mode)
            method, path, body, ctype = _request(case)
            fake.obj, fake.forwarded = case.object, []
            if relaxed and case.object is None:
                # Past authorization the quota stage reads the object a relaxed update
                # changes: let it exist (its owner decides nothing here).
                fake.obj = {"metadata": {"name": "stored", "resourceVersion": "1"}}
            headers = CIMultiDict({"Authorization": f"Bearer {token_of[_identity(case)]}"})
            if case.impersonate is not None:  # as kubectl --as sends it
                headers.extend(case_headers(case.impersonate))
            data = None
            if body is not None:
                data, headers["Content-Type"] = json.dumps(body).encode(), ctype
            async with http.request(method, url + path, data=data, headers=headers) as resp:
                status, raw = resp.status, await resp.read()
            if relaxed:
                problem = _check_relaxed(case, verdict, path, status, raw, fake.forwarded)
            else:
                problem = _check(case, path, status, raw, fake.forwarded)
            if problem:
                mismatches.append(f"{case.where} {case.name}: {problem}")
    assert mismatches == []


def _check(
    case: PolicyCase, path: str, status: int, raw: bytes, forwarded: list[tuple[str, str, Any]]
) -> str:
    expect = case.expect
    if expect in ("deny", "notfound"):
        want = 403 if expect == "deny" else 404
        if status != want:
            return f"expected {want} for {expect}, got {status} {raw[:200]!r}"
        if forwarded:
            return f"refused but forwarded: {forwarded}"
        if json.loads(raw).get("kind") != "Status":
            return "refusal without a Status body"
        return ""
    if not 200 <= status < 300:
        return f"expected 2xx for {expect}, got {status} {raw[:200]!r}"
    if _answered_by_sidecar(path):
        return f"forwarded: {forwarded}" if forwarded else ""
    forwarded, problem = _without_dry_run(case, forwarded)
    if problem:
        return problem
    if len(forwarded) != 1:
        return f"expected one forwarded request, got {forwarded}"
    if expect == "filter":
        _, qs, fbody = forwarded[0]
        if case.method == "GET" and f"owner={case.tenant}" not in qs:
            return f"a filtered list forwarded without ?owner=: {qs}"
        if case.method == "POST" and (fbody or {}).get("spec", {}).get("owner") != case.tenant:
            return f"a filtered create forwarded without the caller's owner: {fbody}"
    return ""


def _check_relaxed(
    case: PolicyCase,
    verdict: Verdict,
    path: str,
    status: int,
    raw: bytes,
    forwarded: list[tuple[str, str, Any]],
) -> str:
    """A refusal the caller's mode relaxes: forwarded once, as the verdict asks."""
    if _answered_by_sidecar(path):
        return f"a relaxed refusal of the sidecar's own API: {status} {raw[:200]!r}"
    if not 200 <= status < 300:
        return f"relaxed ({verdict.outcome}) but answered {status} {raw[:200]!r}"
    forwarded, problem = _without_dry_run(case, forwarded)
    if problem:
        return f"relaxed: {problem}"
    if len(forwarded) != 1:
        return f"relaxed: expected one forwarded request, got {forwarded}"
    if verdict.body is not None and forwarded[0][2] != verdict.body:
        return f"relaxed write forwarded {forwarded[0][2]}, not the checked {verdict.body}"
    return ""


def _without_dry_run(
    case: PolicyCase, forwarded: list[tuple[str, str, Any]]
) -> tuple[list[tuple[str, str, Any]], str]:
    """The forwarded requests without the quota stage's dry run of an update of a
    quota-tracked object (DESIGN §7: the same request with `dryRun=All`, sent first),
    and a problem when there is such a dry run but the request after it is not the
    same one, unchanged and without `dryRun`."""
    if not forwarded or ("dryRun", "All") not in _query(forwarded[0][1]):
        return forwarded, ""
    (dry_method, dry_qs, dry_body), rest = forwarded[0], forwarded[1:]
    if case.method not in ("PUT", "PATCH") or not rest:
        return forwarded, f"a dry run, but no {case.method} after it: {forwarded}"
    method, qs, body = rest[0]
    body = _without_precondition(body, dry_body)
    expected = [q for q in _query(dry_qs) if q != ("dryRun", "All")]
    if (method, qs.partition("?")[0], _query(qs), body) != (
        dry_method,
        dry_qs.partition("?")[0],
        expected,
        dry_body,
    ):
        return forwarded, f"the request after the dry run is not the same one: {forwarded}"
    return rest, ""


def _query(path_qs: str) -> list[tuple[str, str]]:
    return parse_qsl(path_qs.partition("?")[2], keep_blank_values=True)


def test_relaxable_refusals_exist_in_both_directories() -> None:
    """The dry-run runs above check both kinds of refusal: some relaxed, some held."""
    for directory in DIRS.values():
        bundle, cases = _cases(directory)
        verdicts = [case_verdict(bundle, c.as_mapping()) for c in cases]
        refused = [v for v in verdicts if not v.allowed]
        assert any(v.relaxable for v in refused), directory
        assert any(v.held for v in refused), directory


def test_no_case_addresses_a_path_the_pipeline_never_decides() -> None:
    """/healthz and /readyz are answered before any stage (DESIGN §9): a case there
    would test a decision the sidecar never makes."""
    for directory in DIRS.values():
        _, cases = _cases(directory)
        assert [c.where for c in cases if c.path in ("/healthz", "/readyz")] == []


def _without_precondition(body: Any, dry_body: Any) -> Any:
    """The real write's body less the dry run's version it is held to (issue 28: a
    charged update is sent with the dry run's `metadata.resourceVersion`)."""
    if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
        return body
    dry_meta = dry_body.get("metadata") if isinstance(dry_body, dict) else None
    if isinstance(dry_meta, dict) and "resourceVersion" in dry_meta:
        return body
    meta = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
    stripped = {k: v for k, v in body.items() if k != "metadata"}
    if meta or isinstance(dry_meta, dict):
        stripped["metadata"] = meta
    return stripped

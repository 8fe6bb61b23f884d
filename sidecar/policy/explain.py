"""`sidecar policy explain` and `sidecar policy compile`, and the PolicyTest case core.

Owns the explanation object of DESIGN §5 (`--json`), the evaluation of one
`PolicyTest` case (`evaluate_case`, reused by `sidecar policy test`), and the argparse
registration of the `explain` and `compile` subcommands. Both decide with the one
decision function (`decide.py`) the running sidecar uses, isolation and owner rules
included, so `explain` says `notfound` exactly when the sidecar answers 404 and `deny`
exactly when it answers 403. A case's `body`, when given, is checked as the sidecar
checks the body of a write (a list is a JSON patch, a mapping a merge patch for PATCH).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from sidecar.context import Identity
from sidecar.errors import StatusError
from sidecar.policy.bundle import PolicyBundle, load_bundle
from sidecar.policy.compile import print_compiled
from sidecar.policy.decide import NO_BODY, decide
from sidecar.policy.decision import OUTCOMES as _OUTCOMES
from sidecar.policy.decision import STATUS, Verdict
from sidecar.policy.owner import PatchKind
from sidecar.target import RequestTarget, TargetError, parse_target

OUTCOMES = frozenset(_OUTCOMES)


def parse_request(method: str, path: str) -> RequestTarget:
    raw_path, _, query = path.partition("?")
    return parse_target(method, raw_path, query)


def case_patch_kind(method: str, body: Any) -> PatchKind:
    """How a test case's body is read: PATCH with a list is a JSON patch, PATCH with
    a mapping a merge patch, anything else the whole object."""
    if method.upper() != "PATCH":
        return ""
    return "json" if isinstance(body, list) else "merge"


def explain_verdict(
    bundle: PolicyBundle,
    identity: Identity,
    method: str,
    path: str,
    obj: Any = None,
    body: Any = NO_BODY,
    conceal: bool = True,
) -> Verdict:
    """The verdict for one request, as the running sidecar decides it. Raises
    TargetError for a malformed path, a 400 StatusError for a body of the wrong type."""
    target = parse_request(method, path)
    return decide(
        bundle,
        identity,
        target,
        obj,
        body,
        conceal=conceal,
        patch=case_patch_kind(method, body),
    )


def explain(
    bundle: PolicyBundle,
    identity: Identity,
    method: str,
    path: str,
    obj: Any = None,
    conceal: bool = True,
) -> dict[str, Any]:
    """The `policy explain --json` object. Raises TargetError for a malformed path."""
    v = explain_verdict(bundle, identity, method, path, obj, conceal=conceal)
    assert v.target is not None
    return {
        "target": v.target.as_dict(),
        "decision": v.outcome,
        "reason": v.reason,
        "revision": v.revision,
    }


def case_identity(raw: Any) -> Identity:
    if not isinstance(raw, Mapping):
        raise ValueError("'identity' must be a mapping with user and tenant")
    user, tenant, groups = raw.get("user"), raw.get("tenant"), raw.get("groups") or []
    if not isinstance(user, str) or not isinstance(tenant, str):
        raise ValueError("'identity' needs string 'user' and 'tenant'")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ValueError("'identity.groups' must be a list of strings")
    return Identity(user, tenant, tuple(groups), "policytest")


def evaluate_case(
    bundle: PolicyBundle, case: Mapping[str, Any], conceal: bool = True
) -> tuple[str, str, str]:
    """(actual outcome, reason, rule id) for one PolicyTest case. A malformed case,
    request or body gives the outcome "error" with the reason."""
    try:
        identity = case_identity(case.get("identity"))
        request = case.get("request")
        if not isinstance(request, Mapping):
            raise ValueError("'request' must be a mapping with method and path")
        method, path = request.get("method", "GET"), request.get("path")
        if not isinstance(method, str) or not isinstance(path, str):
            raise ValueError("'request' needs string 'method' and 'path'")
        body = request.get("body")
        if isinstance(body, str):
            body = json.loads(body)
        v = explain_verdict(
            bundle,
            identity,
            method,
            path,
            case.get("object"),
            NO_BODY if body is None else body,
            conceal,
        )
    except (ValueError, TargetError, StatusError) as exc:
        return "error", str(getattr(exc, "message", exc)), ""
    return v.outcome, v.reason, v.rule_id


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ex = sub.add_parser("explain", help="explain the decision for one request")
    ex.add_argument("--user", required=True)
    ex.add_argument("--tenant", required=True)
    ex.add_argument("--group", action="append", default=[], dest="groups")
    ex.add_argument("--object", default=None, help="the stored object as JSON (owner rules)")
    ex.add_argument("--json", action="store_true", help="print one JSON object")
    ex.add_argument("method")
    ex.add_argument("path")
    ex.add_argument("dirs", nargs="*", default=["policies"])
    ex.set_defaults(func=_explain_cmd)
    comp = sub.add_parser("compile", help="print the compiled Casbin model and policy")
    comp.add_argument("dirs", nargs="+")
    comp.set_defaults(func=_compile_cmd)


def _explain_cmd(args: argparse.Namespace) -> int:
    obj = None
    if args.object is not None:
        try:
            obj = json.loads(args.object)
        except ValueError:
            print("--object is not valid JSON", file=sys.stderr)
            return 2
    bundle, problems = load_bundle(args.dirs)
    for p in problems:
        print(p, file=sys.stderr)
    identity = Identity(args.user, args.tenant, tuple(args.groups), "cli")
    try:
        result = explain(bundle, identity, args.method, args.path, obj)
    except TargetError as exc:
        print(f"bad request target: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    target = result["target"]
    shown = ", ".join(f"{k}={v}" for k, v in target.items() if v not in (None, ""))
    print(f"target:   {shown}")
    print(f"decision: {result['decision']} (HTTP {STATUS[result['decision']]})")
    print(f"reason:   {result['reason']}")
    print(f"revision: {result['revision']}")
    return 0


def _compile_cmd(args: argparse.Namespace) -> int:
    return print_compiled(args.dirs)

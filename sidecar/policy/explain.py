"""`sidecar policy explain` and `sidecar policy compile`, and the PolicyTest case core.

Owns the explanation object of DESIGN §5 (`--json`), the evaluation of one
`PolicyTest` case (`evaluate_case`, reused by `sidecar policy test`), and the argparse
registration of the `explain` and `compile` subcommands. A case is decided exactly as
the authorize stage decides: the engine's decision, then for writes of objects that
carry an owner, unless a cluster-wide grant allows them, the same owner rule on the
body (`engine.owner_checks` + `owner.enforce_owner`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from sidecar.context import Identity
from sidecar.errors import StatusError
from sidecar.isolation import outside_caller_tenant
from sidecar.policy.bundle import PolicyBundle, load_bundle
from sidecar.policy.compile import print_compiled
from sidecar.policy.decision import Decision, Outcome
from sidecar.policy.engine import Match
from sidecar.policy.owner import enforce_owner, patch_kind
from sidecar.target import RequestTarget, TargetError, parse_target

OUTCOMES = frozenset({"allow", "deny", "filter", "notfound"})
# The quota API authorizes with the engine alone; it has no isolation stage.
QUOTA_API_GROUP = "quota.sidecar"


def parse_request(method: str, path: str) -> RequestTarget:
    raw_path, _, query = path.partition("?")
    return parse_target(method, raw_path, query)


def _decide(
    bundle: PolicyBundle,
    identity: Identity,
    target: RequestTarget,
    obj: Any,
    conceal: bool = True,
) -> tuple[RequestTarget, Decision, Match]:
    """Decide as the running sidecar does: the isolation stage first (a target outside
    the caller's tenant that no binding reaches is `notfound`, or `deny` when
    concealment is off), then the authorize stage's decision."""
    engine = bundle.engine
    if target.resource_request:
        target = target.resolve_tenant(identity.tenant)
        if (
            target.api_group != QUOTA_API_GROUP
            and outside_caller_tenant(identity, target)
            and not engine.can_reach(identity, target)
        ):
            where = f"tenant {target.tenant!r}" if target.tenant is not None else "cluster level"
            reason = (
                f"isolation: {where} is outside the caller's tenant {identity.tenant!r} "
                "and no binding in force reaches it"
            )
            outcome: Outcome = "notfound" if conceal else "deny"
            return target, Decision(outcome, reason, bundle.revision), Match()
    match = engine.match(identity, target)
    return target, engine.finish(match, identity, target, obj), match


def explain(
    bundle: PolicyBundle,
    identity: Identity,
    method: str,
    path: str,
    obj: Any = None,
    conceal: bool = True,
) -> dict[str, Any]:
    """The `policy explain --json` object. Raises TargetError for a malformed path."""
    target, decision, _ = _decide(bundle, identity, parse_request(method, path), obj, conceal)
    return {
        "target": target.as_dict(),
        "decision": decision.outcome,
        "reason": decision.reason,
        "revision": decision.revision,
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
    """(actual outcome, reason, rule id) for one PolicyTest case. A malformed case or
    request gives the outcome "error" with the reason."""
    try:
        identity = case_identity(case.get("identity"))
        request = case.get("request")
        if not isinstance(request, Mapping):
            raise ValueError("'request' must be a mapping with method and path")
        method, path = request.get("method", "GET"), request.get("path")
        if not isinstance(method, str) or not isinstance(path, str):
            raise ValueError("'request' needs string 'method' and 'path'")
        target, decision, match = _decide(
            bundle, identity, parse_request(method, path), case.get("object"), conceal
        )
    except (ValueError, TargetError) as exc:
        return "error", str(getattr(exc, "message", exc)), ""
    body = request.get("body")
    fields = bundle.engine.owner_checks(match, identity, target) if decision.allowed else ()
    if body is not None and fields:
        # A list body can only be a JSON patch; a mapping is a merge patch or an object.
        content_type = (
            "application/json-patch+json"
            if isinstance(body, list)
            else ("application/merge-patch+json")
        )
        try:
            doc = json.loads(body) if isinstance(body, str) else body
            enforce_owner(
                doc, identity.tenant, fields, target.verb, patch_kind(method, content_type)
            )
        except ValueError:
            return "error", "the case's body is not valid JSON", decision.rule_id
        except StatusError as exc:
            return ("deny" if exc.code == 403 else "error"), exc.message, decision.rule_id
    return decision.outcome, decision.reason, decision.rule_id


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
    print(f"decision: {result['decision']}")
    print(f"reason:   {result['reason']}")
    print(f"revision: {result['revision']}")
    return 0


def _compile_cmd(args: argparse.Namespace) -> int:
    return print_compiled(args.dirs)

"""`sidecar policy explain` and `sidecar policy compile`, and the PolicyTest case core.

Owns the explanation object of DESIGN §5 (`--json`), the evaluation of one
`PolicyTest` case (`evaluate_case`, reused by `sidecar policy test`), and the argparse
registration of the `explain` and `compile` subcommands. Both decide with the one
decision function (`decide.py`) the running sidecar uses, isolation and owner rules
included, so `explain` says `notfound` exactly when the sidecar answers 404 and `deny`
exactly when it answers 403. A refused request is explained with its near misses:
the caller's own rules that almost allowed it, and what differed. A case's `body`,
when given, is checked as the sidecar checks the body of a write (a list is a JSON
patch, a mapping a merge patch for PATCH).

Every explanation names the mode in force for the caller (`--mode`: the config's
global mode, default enforce; a `TenantMode` of the directory overrides it for its
tenant) and what the live request gets in it: `mode: dry-run (tenant acme): would
deny, forwarded` (`--json`: `"mode"`, `"modeSource"`, `"live"`: "forwarded" or the
refusal's outcome, and that line as `"modeNote"`). A mode relaxes only what the
verdict says it may (`Verdict.relaxable`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.core.target import RequestTarget, TargetError, parse_target
from sidecar.policy.compile import NO_DOMAIN, print_compiled, rule_match, tenant_ok
from sidecar.policy.decide import NO_BODY, decide
from sidecar.policy.decision import OUTCOMES as _OUTCOMES
from sidecar.policy.decision import STATUS, Verdict
from sidecar.policy.engine import PolicyEngine, request_vector, subject_keys
from sidecar.policy.kinds.impersonation import case_impersonation
from sidecar.policy.kinds.modes import ENFORCE, MODES, describe, forwards, mode_for, mode_source
from sidecar.policy.owner import JSON_PATCH, MERGE_PATCH, PatchKind, patch_kind
from sidecar.policy.rbac import Rule
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.tools.apisource import ApiSourceError, add_api_options, api_layer, with_api

OUTCOMES = frozenset(_OUTCOMES)


def parse_request(method: str, path: str) -> RequestTarget:
    return parse_target(method, path)


def case_patch_kind(method: str, body: Any) -> PatchKind:
    """How a test case's body is read (a case has no Content-Type): PATCH with a list
    as a JSON patch, PATCH with a mapping as a merge patch, anything else the whole
    object; then as the sidecar reads a request with that Content-Type."""
    return patch_kind(method, JSON_PATCH if isinstance(body, list) else MERGE_PATCH)


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
    global_mode: str = ENFORCE,
) -> dict[str, Any]:
    """The `policy explain --json` object. Raises TargetError for a malformed path.
    `global_mode`: the config's `mode`, which a TenantMode of the bundle overrides."""
    v = explain_verdict(bundle, identity, method, path, obj, conceal=conceal)
    assert v.target is not None
    mode = mode_for(global_mode, bundle.tenant_modes, identity.tenant)
    out: dict[str, Any] = {
        "target": v.target.as_dict(),
        "decision": v.outcome,
        "reason": v.reason,
        "revision": v.revision,
        "mode": mode,
        "modeSource": mode_source(bundle.tenant_modes, identity.tenant),
        "live": "forwarded" if forwards(v, mode) else v.outcome,
        "modeNote": describe(mode, mode_source(bundle.tenant_modes, identity.tenant), v),
    }
    if not v.allowed:
        out["nearMisses"] = near_misses(bundle.engine, identity, v.target)
    return out


# How far a difference is from an allow: a name or owner is closer than a resource.
_WEIGHT = {"name": 1, "owner": 1, "verb": 2, "namespace": 2}


def near_misses(
    engine: PolicyEngine, identity: Identity, target: RequestTarget, limit: int = 3
) -> list[dict[str, Any]]:
    """Up to `limit` rules of the caller's own bindings that almost allow the request
    (one or two differences: namespace or scope, verb, resource, API group, name,
    owner), closest first. For operators (`policy explain`) only: an access review keeps
    its reason, so nothing about other subjects' grants leaks."""
    vec = request_vector(identity, target)
    if isinstance(vec, str):
        return []
    nd, td, scope, grp, res, name, verb = vec[1:]
    keys = set(subject_keys(identity))
    found: list[tuple[int, str, list[str]]] = []
    for (sub, role_key, dom), bindings in engine.compiled.link_bindings.items():
        role = engine.policy.roles.get(role_key)
        if sub not in keys or role is None:
            continue
        for rule in role.rules:
            if bool(rule.non_resource_urls) != (scope == "url"):
                continue
            differs = _differences(rule, dom, nd, td, scope, grp, res, name, verb)
            if not differs and rule.owner:
                differs = [
                    f"owner: the rule grants only objects whose {rule.owner_field} is "
                    f"{identity.tenant!r}"
                ]
            if 0 < len(differs) <= 2:
                via = f"{bindings[0].label} → {role.label} → rule {rule.rule_id}"
                found.append((len(differs), via, differs))
    found.sort(key=lambda f: (f[0], sum(_WEIGHT.get(d.partition(":")[0], 3) for d in f[2]), f[1]))
    unique = list(dict.fromkeys((via, tuple(d)) for _, via, d in found))
    return [{"via": via, "differs": list(d)} for via, d in unique[:limit]]


def _differences(
    rule: Rule, dom: str, nd: str, td: str, scope: str, grp: str, res: str, name: str, verb: str
) -> list[str]:
    out: list[str] = []
    cond = f"owner:{rule.owner_field}" if rule.owner else ""
    if not (dom in ("*", nd) or (dom == td and tenant_ok(scope, cond))):
        if dom == td:
            out.append("owner: at the cluster level a tenant's binding grants only through "
                       "owner rules (when: owner)")  # fmt: skip
        elif "/" in dom:
            where = f"namespace {nd}" if nd != NO_DOMAIN else f"the {scope} level"
            out.append(f"namespace: the binding is in force in namespace {dom}, the request "
                       f"is in {where}")  # fmt: skip
        else:
            out.append(f"scope: the binding is in force in tenant {dom} only")
    if "*" not in rule.verbs and verb not in rule.verbs:
        out.append(f"verb: the rule grants {', '.join(rule.verbs)}, not {verb}")
    if scope == "url":
        if not rule_match("url", "", res, "", verb, "url", "", ",".join(rule.non_resource_urls),
                          "", "*"):  # fmt: skip
            out.append(f"URL: the rule names {', '.join(rule.non_resource_urls)}, not {res}")
        return out
    if "*" not in rule.api_groups and grp not in rule.api_groups:
        groups = ", ".join(repr(g) for g in rule.api_groups)
        out.append(f"API group: the rule names {groups}, not {grp!r}")
    if not rule_match(scope, "", res, "", "get", "res", "*", ",".join(rule.resources),
                      "", "*"):  # fmt: skip
        out.append(f"resource: the rule names {', '.join(rule.resources)}, not {res}")
    if rule.resource_names and name not in rule.resource_names:
        out.append(f"name: the rule is limited to {', '.join(rule.resource_names)}"
                   + (f", not {name}" if name else ", the request names no object"))  # fmt: skip
    return out


def case_identity(raw: Any) -> Identity:
    if not isinstance(raw, Mapping):
        raise ValueError("'identity' must be a mapping with user and tenant")
    user, tenant, groups = raw.get("user"), raw.get("tenant"), raw.get("groups") or []
    if not isinstance(user, str) or not isinstance(tenant, str):
        raise ValueError("'identity' needs string 'user' and 'tenant'")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ValueError("'identity.groups' must be a list of strings")
    return Identity(user, tenant, tuple(groups), "policytest")


def case_verdict(bundle: PolicyBundle, case: Mapping[str, Any], conceal: bool = True) -> Verdict:
    """The verdict for one PolicyTest case. Raises ValueError, TargetError or a 400
    StatusError for a malformed case, request or body."""
    identity = case_identity(case.get("identity"))
    if case.get("impersonate") is not None:
        identity, refused = case_impersonation(bundle, identity, case["impersonate"], conceal)
        if refused is not None:
            return refused
    request = case.get("request")
    if not isinstance(request, Mapping):
        raise ValueError("'request' must be a mapping with method and path")
    method, path = request.get("method", "GET"), request.get("path")
    if not isinstance(method, str) or not isinstance(path, str):
        raise ValueError("'request' needs string 'method' and 'path'")
    body = request.get("body")
    if isinstance(body, str):
        body = json.loads(body)
    return explain_verdict(
        bundle,
        identity,
        method,
        path,
        case.get("object"),
        NO_BODY if body is None else body,
        conceal,
    )


def evaluate_case(
    bundle: PolicyBundle, case: Mapping[str, Any], conceal: bool = True
) -> tuple[str, str, str]:
    """(actual outcome, reason, rule id) for one PolicyTest case. A malformed case,
    request or body gives the outcome "error" with the reason."""
    try:
        v = case_verdict(bundle, case, conceal)
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
    ex.add_argument(
        "--mode",
        choices=MODES,
        default=ENFORCE,
        help="the config's global mode (a TenantMode of DIR overrides it for its tenant)",
    )
    ex.add_argument("method")
    ex.add_argument("path")
    ex.add_argument("dirs", nargs="*", default=["policies"])
    add_api_options(ex)
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
    try:  # and the policy objects stored through the API (--api, --api-dump)
        bundle = with_api(bundle, api_layer(args))
    except ApiSourceError as exc:
        print(f"sidecar policy explain: {exc}", file=sys.stderr)
        return 2
    identity = Identity(args.user, args.tenant, tuple(args.groups), "cli")
    try:
        result = explain(bundle, identity, args.method, args.path, obj, global_mode=args.mode)
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
    print(f"mode:     {result['modeNote']}")
    print(f"revision: {result['revision']}")
    for miss in result.get("nearMisses", []):
        print(f"near miss: {miss['via']}")
        for d in miss["differs"]:
            print(f"    {d}")
    return 0


def _compile_cmd(args: argparse.Namespace) -> int:
    return print_compiled(args.dirs)

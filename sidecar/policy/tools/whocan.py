"""`sidecar policy who-can` and `sidecar policy can-i --list`.

Owns the two operator questions asked of a policy directory:
- who-can VERB RESOURCE: every binding subject (and `system:authenticated`) for whom
  the one decision function (`decide.py`) allows the request, with the binding → role →
  rule that does; a grant that holds only for objects the subject's tenant owns is
  marked owner-only. Without `--name`, an item verb (get, update, patch, delete, and
  every subresource verb: `patch nodes/power`) is asked of "some object": an owner
  rule grants it for the objects the subject's tenant owns, so it is listed, owner-only.
  A subject that gets the access only as an authenticated caller is not repeated (the
  `system:authenticated` line says it).
- can-i --list: the rules in force for an identity, computed by `rules.py` (the code
  behind `selfsubjectrulesreviews`), owner rules marked, and the mode in force for it
  (`--mode`: the config's global mode; a TenantMode of DIR overrides it).

RESOURCE is `resource[.group][/subresource]` (`pods`, `servers.compute`,
`nodes/power`). An unknown verb, or a resource no rule names and the scope tables do
not know, is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Any

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope, is_dns1123_label
from sidecar.policy.decide import decide
from sidecar.policy.kinds.impersonation import RESOURCES as IMPERSONATION_RESOURCES
from sidecar.policy.kinds.modes import ENFORCE, MODES, mode_for, mode_source, summary
from sidecar.policy.rbac import AUTHENTICATED_GROUP, OWNER_ITEM_VERBS, RESOURCE_VERBS
from sidecar.policy.scopes import CLUSTER_SCOPED, TENANT_SCOPED, is_cluster_scoped
from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.tools.apisource import (
    VALUED_API_OPTIONS,
    ApiSourceError,
    add_api_options,
    api_layer,
    with_api,
)
from sidecar.policy.tools.rules import rules_in_force

# A user name no subject may have (a User subject named `*` is a validation error), so
# the probe identity of a group has the group's grants and nothing of its own.
_NOBODY = "*"
# The name of "some object" an item verb without --name is asked of (owner rules).
_SOME_OBJECT = "who-can-some-object"


class WhoCanError(Exception):
    """Bad input to who-can / can-i (exit 2)."""


@dataclass(frozen=True, slots=True)
class Holder:
    subject: str  # "User alice (tenant acme)"
    via: str
    owner_only: bool

    def as_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "via": self.via, "ownerOnly": self.owner_only}


def parse_resource(spec: str) -> tuple[str, str, str]:
    """`resource[.group][/subresource]` → (group, resource, subresource)."""
    head, _, sub = spec.partition("/")
    resource, _, group = head.partition(".")
    if not resource or "*" in spec:
        raise WhoCanError(f"bad resource {spec!r} (resource[.group][/subresource])")
    return group, resource, sub


def who_can_target(
    bundle: PolicyBundle, verb: str, spec: str, tenant: str, namespace: str, name: str
) -> RequestTarget:
    if verb not in RESOURCE_VERBS or verb == "*":
        known = ", ".join(sorted(RESOURCE_VERBS - {"*"}))
        raise WhoCanError(f"unknown verb {verb!r} (one of {known})")
    group, resource, sub = parse_resource(spec)
    if not _known(bundle, group, resource):
        raise WhoCanError(
            f"unknown resource {spec!r}: no rule of the policy names {resource!r} "
            f"in API group {group or 'core'!r}"
        )
    for label, value in (("tenant", tenant), ("namespace", namespace)):
        if value and not is_dns1123_label(value):
            raise WhoCanError(f"bad --{label} {value!r}")
    if namespace and not tenant:
        raise WhoCanError("--namespace needs --tenant")
    if is_cluster_scoped(group, resource):
        if namespace:
            raise WhoCanError(f"{resource!r} is cluster-scoped: --namespace makes no sense")
        scope, tenant_of, ns = Scope.CLUSTER, None, None
    elif namespace:
        scope, tenant_of, ns = Scope.NAMESPACE, tenant, namespace
    elif tenant:
        scope, tenant_of, ns = Scope.TENANT, tenant, None
    else:
        scope, tenant_of, ns = Scope.CLUSTER, None, None
    return RequestTarget(
        path=f"who-can {verb} {spec}",
        verb=verb,
        resource_request=True,
        api_group=group,
        scope=scope,
        tenant=tenant_of,
        namespace=ns,
        resource=resource,
        subresource=sub,
        name=name,
    )


def _known(bundle: PolicyBundle, group: str, resource: str) -> bool:
    if (group, resource) in CLUSTER_SCOPED | TENANT_SCOPED | IMPERSONATION_RESOURCES:
        return True
    for role in bundle.engine.policy.roles.values():
        for rule in role.rules:
            if group in rule.api_groups or "*" in rule.api_groups:
                if any(r.partition("/")[0] == resource for r in rule.resources):
                    return True
    return False


def _probes(bundle: PolicyBundle, only_tenant: str) -> list[tuple[str, Identity]]:
    """(label, identity) for every binding subject, plus system:authenticated for each
    tenant named (`only_tenant`: the target's, also probed)."""
    out: dict[str, Identity] = {}
    tenants: set[str] = set()
    for binding in bundle.engine.policy.bindings:
        for s in binding.subjects:
            if s.tenant == "*":
                continue
            tenants.add(s.tenant)
            if s.kind == "Group":
                label = f"Group {s.name} (tenant {s.tenant})"
                out[label] = Identity(_NOBODY, s.tenant, (s.name,), "who-can")
            elif s.kind == "ServiceAccount":
                label = f"ServiceAccount {s.namespace}/{s.name} (tenant {s.tenant})"
                user = f"system:serviceaccount:{s.namespace}:{s.name}"
                out[label] = Identity(user, s.tenant, (), "who-can")
            else:
                out[f"User {s.name} (tenant {s.tenant})"] = Identity(
                    s.name, s.tenant, (), "who-can"
                )
    probes = sorted(out.items())
    base = [
        (f"Group {AUTHENTICATED_GROUP} (tenant {t})", Identity(_NOBODY, t, (), "who-can"))
        for t in sorted(tenants | ({only_tenant} if only_tenant else set()))
    ]
    return base + probes


def _grant(bundle: PolicyBundle, identity: Identity, target: RequestTarget) -> Holder | None:
    v = decide(bundle, identity, target, None)
    if v.allowed:
        return Holder("", v.explanation, v.outcome == "filter")
    if not target.name and target.verb in OWNER_ITEM_VERBS:
        # "Some object": an owner rule decides an item by its owner, so ask of one.
        target = dataclasses.replace(target, name=_SOME_OBJECT)
        v = decide(bundle, identity, target, None)
    if v.needs_object:
        v2 = decide(bundle, identity, target, _owned(v.owner_field, identity.tenant))
        if v2.allowed:
            return Holder("", v2.explanation, True)
    return None


def _owned(field: str, tenant: str) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    cur = obj
    parts = field.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = tenant
    return obj


def who_can(bundle: PolicyBundle, target: RequestTarget) -> list[Holder]:
    holders: list[Holder] = []
    base: dict[str, Holder | None] = {}
    for label, identity in _probes(bundle, target.tenant or ""):
        found = _grant(bundle, identity, target)
        if found is None:
            continue
        if identity.user == _NOBODY and not identity.groups:
            base[identity.tenant] = found
        elif identity.tenant in base or _grant_as_authenticated(bundle, identity, target):
            continue  # nothing beyond what every authenticated caller gets
        holders.append(Holder(label, found.via, found.owner_only))
    return holders


def _grant_as_authenticated(
    bundle: PolicyBundle, identity: Identity, target: RequestTarget
) -> bool:
    return _grant(bundle, Identity(_NOBODY, identity.tenant, (), "who-can"), target) is not None


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser("who-can", help="the subjects that may do VERB on RESOURCE")
    w.add_argument("verb", metavar="VERB")
    w.add_argument("resource", metavar="RESOURCE", help="resource[.group][/subresource]")
    w.add_argument("--tenant", default="")
    w.add_argument("--namespace", default="")
    w.add_argument("--name", default="")
    w.add_argument("--json", action="store_true")
    w.add_argument("dir", nargs="?", default="policies", metavar="DIR")
    w.set_defaults(func=_who_can_cmd)
    add_api_options(w)
    _options_first(w, {"--tenant", "--namespace", "--name", *VALUED_API_OPTIONS})
    c = sub.add_parser("can-i", help="the rules in force for an identity (--list)")
    c.add_argument("--list", action="store_true", required=True)
    c.add_argument("--user", required=True)
    c.add_argument("--tenant", required=True)
    c.add_argument("--group", action="append", default=[], dest="groups")
    c.add_argument("--namespace", default="")
    c.add_argument("--json", action="store_true")
    c.add_argument(
        "--mode",
        choices=MODES,
        default=ENFORCE,
        help="the config's global mode (a TenantMode of DIR overrides it for its tenant)",
    )
    c.add_argument("dir", nargs="?", default="policies", metavar="DIR")
    c.set_defaults(func=_can_i_cmd)
    add_api_options(c)
    _options_first(
        c, {"--user", "--tenant", "--group", "--namespace", "--mode", *VALUED_API_OPTIONS}
    )


def _options_first(parser: argparse.ArgumentParser, valued: set[str]) -> None:
    """Let the optional DIR follow options (`who-can get pods --tenant t DIR`): Python
    3.11's argparse binds an optional positional before the options that follow it."""
    original = parser.parse_known_args

    def parse(args: Any = None, namespace: Any = None) -> Any:
        words, options = list(args or []), []
        rest: list[str] = []
        while words:
            w = words.pop(0)
            if w == "--":
                rest += [w, *words]
                break
            if w.startswith("-"):
                options.append(w)
                if w in valued and words:
                    options.append(words.pop(0))
            else:
                rest.append(w)
        return original([*options, *rest], namespace)

    setattr(parser, "parse_known_args", parse)  # noqa: B010


def _load(path: str, command: str, args: argparse.Namespace | None = None) -> PolicyBundle | None:
    bundle, problems = load_bundle([path])
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(
            f"sidecar policy {command}: {path} does not validate: {problems[0]}{more}",
            file=sys.stderr,
        )
        return None
    if args is None:
        return bundle
    try:  # and the policy objects stored through the API (--api, --api-dump)
        return with_api(bundle, api_layer(args))
    except ApiSourceError as exc:
        print(f"sidecar policy {command}: {exc}", file=sys.stderr)
        return None


def _who_can_cmd(args: argparse.Namespace) -> int:
    bundle = _load(args.dir, "who-can", args)
    if bundle is None:
        return 2
    try:
        target = who_can_target(
            bundle, args.verb, args.resource, args.tenant, args.namespace, args.name
        )
    except WhoCanError as exc:
        print(f"sidecar policy who-can: {exc}", file=sys.stderr)
        return 2
    holders = who_can(bundle, target)
    if args.json:
        print(json.dumps([h.as_json() for h in holders]))
        return 0
    if not holders:
        print("nobody")
    for h in holders:
        mark = " [owner-only]" if h.owner_only else ""
        print(f"{h.subject}{mark}\n    via {h.via}")
    return 0


def _can_i_cmd(args: argparse.Namespace) -> int:
    bundle = _load(args.dir, "can-i", args)
    if bundle is None:
        return 2
    for label, value in (("tenant", args.tenant), ("namespace", args.namespace)):
        if value and not is_dns1123_label(value):
            print(f"sidecar policy can-i: bad --{label} {value!r}", file=sys.stderr)
            return 2
    identity = Identity(args.user, args.tenant, tuple(args.groups), "cli")
    rules = rules_in_force(bundle.engine, identity, args.tenant, args.namespace)
    mode = mode_for(args.mode, bundle.tenant_modes, args.tenant)
    source = mode_source(bundle.tenant_modes, args.tenant)
    if args.json:
        print(
            json.dumps(
                {
                    "mode": mode,
                    "modeSource": source,
                    "resourceRules": [r.as_k8s() for r in rules.resource_rules],
                    "nonResourceRules": [r.as_k8s() for r in rules.non_resource_rules],
                    "ownerRules": [
                        {**r.as_k8s(), "ownerField": r.owner_field} for r in rules.owner_rules
                    ],
                }
            )
        )
        return 0
    print(f"mode: {summary(mode, source, args.tenant)}")
    print(f"{'Resources':<40} {'Non-Resource URLs':<20} {'Resource Names':<20} Verbs")
    for r in rules.resource_rules + rules.owner_rules:
        res = ", ".join(f"{x}.{g}" if g else x for x in r.resources for g in r.api_groups)
        mark = f" [owner-only: {r.owner_field}]" if r.owner_field else ""
        names = ", ".join(r.resource_names)
        print(f"{res:<40} {'':<20} {names:<20} [{' '.join(r.verbs)}]{mark}")
    for u in rules.non_resource_rules:
        print(f"{'':<40} {', '.join(u.non_resource_urls):<20} {'':<20} [{' '.join(u.verbs)}]")
    return 0

"""Impersonation (DESIGN §4): who may act as whom, decided by the one decision function.

`kubectl --as=vera --as-group=viewers` sends `Impersonate-User: vera` and
`Impersonate-Group: viewers`; `--as-uid` sends `Impersonate-Uid`, a kubeconfig's
`as-user-extra` one `Impersonate-Extra-{key}` per value. This module owns, without any
I/O:

- `parse_impersonation`: the headers read as an `Impersonation` (Kubernetes' reading:
  an extra's key is lower-cased, then percent-decoded), or a 400 for malformed ones: an
  empty user, a group, uid or extra without a user, a user or uid given twice, a name
  that is not `printable`, an `Impersonate-Extra-Tenant` that is not exactly one
  DNS-1123 label, more than `MAX_VALUES` values. Other `Impersonate-*` names are not
  read (as in Kubernetes); the proxy drops every `Impersonate-*` header anyway.
- `decide_impersonation`: whether the caller may become that identity. The impersonated
  user's tenant is `Impersonate-Extra-Tenant` when given, else the caller's own. The
  caller needs verb `impersonate` on `users` (name = the user), `groups` (each group),
  `userextras/{key}` (each value) and `uids` (the last two in API group
  `authentication.k8s.io`), in that order, as requests in the impersonated tenant's
  scope (a tenant-scoped target there), each decided by `decide.decide`: so a
  TenantRoleBinding grants impersonation inside its own tenant only, and only a
  ClusterRoleBinding across tenants. Before any policy: a caller of a tenant other
  than `system` never becomes a user of another tenant (nor of `system`). The first
  refused attribute is named in a 403 (Kubernetes' wording, with the tenants). No
  mode relaxes it: a dry-run never acts as someone it may not be.
- `Impersonation.identity`: the identity every later stage sees, with the caller in
  `impersonated_by`. Its groups are exactly the `Impersonate-Group` values (the
  impersonated user's own groups are not looked up, as in Kubernetes). The sidecar's
  identities carry no uid and no extras besides the tenant: an allowed uid or extra is
  decided, written to the audit line, and goes nowhere else.

The impersonation stage (`sidecar/pipeline/impersonation.py`) and `policy test` cases
with `impersonate:` (`explain.evaluate_case`) both go through these functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from sidecar.core.identity import Identity, printable
from sidecar.core.status import StatusError, bad_request, forbidden_message
from sidecar.core.target import RequestTarget, Scope, is_dns1123_label
from sidecar.policy.decide import AUTHENTICATION_GROUP, decide
from sidecar.policy.decision import Verdict
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.rbac import group_key, user_key

if TYPE_CHECKING:
    from sidecar.policy.engine import DecisionCache
    from sidecar.policy.source.bundle import PolicyBundle

VERB = "impersonate"
# (API group, resource) of every attribute the verb is decided on.
RESOURCES = frozenset(
    {
        ("", "users"),
        ("", "groups"),
        (AUTHENTICATION_GROUP, "userextras"),
        (AUTHENTICATION_GROUP, "uids"),
    }
)
PREFIX = "impersonate-"
USER = "impersonate-user"
GROUP = "impersonate-group"
UID = "impersonate-uid"
EXTRA = "impersonate-extra-"
# `Impersonate-Extra-Tenant`: the tenant of the impersonated user.
TENANT_KEY = "tenant"
# Values of all impersonation headers together: each is one decision.
MAX_VALUES = 64

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")

__all__ = [
    "MAX_VALUES",
    "Impersonation",
    "ImpersonationVerdict",
    "case_headers",
    "case_impersonation",
    "decide_impersonation",
    "parse_impersonation",
    "requested",
]


@dataclass(frozen=True, slots=True)
class Impersonation:
    """Whom a request asks to act as: the decoded `Impersonate-*` headers."""

    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    # (key, values) in the order the headers came; the tenant's key included.
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def tenant(self) -> str | None:
        """`Impersonate-Extra-Tenant`, when given."""
        for key, values in self.extra:
            if key == TENANT_KEY:
                return values[0]
        return None

    def tenant_for(self, caller: Identity) -> str:
        """The impersonated user's tenant: the one asked for, else the caller's."""
        return self.tenant or caller.tenant

    def identity(self, caller: Identity) -> Identity:
        """The identity every stage after the impersonation stage sees."""
        return Identity(
            self.user,
            self.tenant_for(caller),
            self.groups,
            caller.authenticator,
            impersonated_by=caller,
        )

    def targets(self, tenant: str) -> list[RequestTarget]:
        """What the caller must be allowed, in Kubernetes' order (user, groups, extras,
        uid): verb `impersonate` on tenant-scoped targets in `tenant`."""

        def target(group: str, resource: str, name: str, sub: str = "") -> RequestTarget:
            return RequestTarget(
                path="",
                verb=VERB,
                resource_request=True,
                api_group=group,
                api_version="v1",
                scope=Scope.TENANT,
                tenant=tenant,
                resource=resource,
                subresource=sub,
                name=name,
            )

        out = [target("", "users", self.user)]
        out += [target("", "groups", g) for g in self.groups]
        out += [
            target(AUTHENTICATION_GROUP, "userextras", value, key)
            for key, values in self.extra
            for value in values
        ]
        if self.uid:
            out.append(target(AUTHENTICATION_GROUP, "uids", self.uid))
        return out

    def record(self) -> dict[str, Any]:
        """What the audit line shows of it."""
        out: dict[str, Any] = {"user": self.user, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {key: list(values) for key, values in self.extra}
        return out


@dataclass(frozen=True, slots=True)
class ImpersonationVerdict:
    allowed: bool
    # The grant of each attribute ("binding → role → rule"), or why it was refused.
    reason: str
    # The 403 to answer when refused.
    error: StatusError | None = None


def requested(names: Iterable[str]) -> bool:
    """Whether any header name is an `Impersonate-*` one (cheap: asked on every request)."""
    return any(name[:1] in "iI" and name[:12].lower() == PREFIX for name in names)


def parse_impersonation(headers: Iterable[tuple[str, str]]) -> Impersonation | None:
    """The impersonation the headers ask for (None: none); a 400 StatusError for
    malformed headers."""
    users: list[str] = []
    groups: list[str] = []
    uids: list[str] = []
    extra: dict[str, list[str]] = {}
    count = 0
    for name, value in headers:
        lower = name.lower()
        if not lower.startswith(PREFIX):
            continue
        if lower == USER:
            users.append(value)
        elif lower == GROUP:
            groups.append(value)
        elif lower == UID:
            uids.append(value)
        elif lower.startswith(EXTRA):
            extra.setdefault(_extra_key(name[len(EXTRA) :]), []).append(value)
        else:
            continue
        count += 1
        if count > MAX_VALUES:
            raise bad_request(f"more than {MAX_VALUES} impersonation header values")
    if not users:
        if groups or uids or extra:
            raise bad_request(
                "Impersonate-Group, Impersonate-Uid and Impersonate-Extra-* need an "
                "Impersonate-User: requested impersonation without impersonating a user"
            )
        return None
    if len(users) > 1:
        raise bad_request("Impersonate-User may be given once")
    if len(uids) > 1:
        raise bad_request("Impersonate-Uid may be given once")
    user = users[0]
    if not user:
        raise bad_request("Impersonate-User is empty")
    _check_name("Impersonate-User", user)
    for group in groups:
        _check_name("Impersonate-Group", group)
    uid = uids[0] if uids else ""
    if uids:
        _check_name("Impersonate-Uid", uid)
    for key, values in extra.items():
        for value in values:
            _check_name(f"Impersonate-Extra-{quote(key, safe='')}", value)
    tenant = extra.get(TENANT_KEY)
    if tenant is not None and (len(tenant) != 1 or not is_dns1123_label(tenant[0])):
        raise bad_request("Impersonate-Extra-Tenant must be given once, a DNS-1123 label")
    return Impersonation(
        user,
        tuple(dict.fromkeys(groups)),
        uid,
        tuple((key, tuple(values)) for key, values in extra.items()),
    )


def _extra_key(raw: str) -> str:
    """An extra's key as Kubernetes reads it: lower-cased, then percent-decoded. An
    invalid escape or a key that decodes to nothing usable is a 400 (Kubernetes keeps
    such a key undecoded; the sidecar reads every header one way or refuses it)."""
    lower = raw.lower()
    if not lower or _BAD_ESCAPE.search(lower):
        raise bad_request("an Impersonate-Extra-* header has an empty or malformed key")
    try:
        key = unquote(lower, errors="strict")
    except UnicodeDecodeError:
        raise bad_request("an Impersonate-Extra-* key is not UTF-8") from None
    if not printable(key):
        raise bad_request("an Impersonate-Extra-* key is not a valid name")
    return key


def _check_name(header: str, value: str) -> None:
    if not printable(value):
        raise bad_request(
            f"{header} must be 1 to 256 characters without control characters or line separators"
        )


def decide_impersonation(
    bundle: PolicyBundle | PolicyEngine,
    caller: Identity,
    asked: Impersonation,
    *,
    conceal: bool = True,
    cache: DecisionCache | None = None,
) -> ImpersonationVerdict:
    """Whether `caller` may act as `asked` (see the module docstring)."""
    tenant = asked.tenant_for(caller)
    targets = asked.targets(tenant)
    if not caller.is_operator and tenant != caller.tenant:
        why = f"a user of tenant {caller.tenant!r} can never become a user of another tenant"
        return _refused(caller, targets[0], why, why)
    engine = bundle if isinstance(bundle, PolicyEngine) else bundle.engine
    grants: list[str] = []
    for target in targets:
        v = decide(bundle, caller, target, conceal=conceal, cache=cache)
        if v.outcome != "allow":
            return _refused(caller, target, v.reason)
        # A subject a ClusterRoleBinding names holds grants across tenants: becoming it
        # takes a cluster-wide grant, never a tenant's own (found by a hostile review:
        # a tenant admin impersonated its tenant's group bound cluster-wide).
        crb = _bound_cluster_wide(engine, tenant, target)
        if crb and not engine.cluster_wide(caller, target):
            why = (
                f"{crb} names {target.resource[:-1]} {target.name!r}: "
                "only a cluster-wide grant may impersonate it"
            )
            return _refused(caller, target, why, why)
        grants.append(f"{target.full_resource} {target.name!r}: {v.explanation}")
    return ImpersonationVerdict(True, "impersonation allowed: " + "; ".join(grants))


def _bound_cluster_wide(engine: PolicyEngine, tenant: str, target: RequestTarget) -> str:
    if target.api_group != "" or target.resource not in ("users", "groups"):
        return ""
    key = (user_key if target.resource == "users" else group_key)(tenant, target.name)
    return engine.bound_cluster_wide(key)


def _refused(
    caller: Identity, target: RequestTarget, reason: str, why: str = ""
) -> ImpersonationVerdict:
    """The 403 naming the refused attribute, whatever `decide` would answer for a
    request (a concealed 404 included): the caller named that identity itself."""
    message = forbidden_message(caller.user, caller.tenant, target)
    if why:
        message += f": {why}"
    error = StatusError(
        403,
        message,
        details={"name": target.name, "group": target.api_group, "kind": target.resource},
    )
    return ImpersonationVerdict(False, reason, error)


def case_headers(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A PolicyTest case's `impersonate: {user, groups, uid, tenant, extra}` as the
    headers kubectl sends; ValueError when it is not of that shape."""
    unknown = set(spec) - {"user", "groups", "uid", "tenant", "extra"}
    if unknown:
        raise ValueError(f"unknown field(s) in 'impersonate': {', '.join(sorted(unknown))}")

    def strings(key: str, value: Any) -> list[str]:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in items):
            raise ValueError(f"impersonate.{key} must be a string or a list of strings")
        return list(items)

    headers = [("Impersonate-User", v) for v in strings("user", spec.get("user", []))]
    headers += [("Impersonate-Group", v) for v in strings("groups", spec.get("groups", []))]
    headers += [("Impersonate-Uid", v) for v in strings("uid", spec.get("uid", []))]
    tenant = spec.get("tenant", [])
    headers += [(f"{EXTRA}{TENANT_KEY}", v) for v in strings("tenant", tenant)]
    extra = spec.get("extra", {})
    if not isinstance(extra, Mapping):
        raise ValueError("impersonate.extra must be a mapping of key to values")
    for key, values in extra.items():
        name = f"Impersonate-Extra-{quote(str(key), safe='')}"
        headers += [(name, v) for v in strings(f"extra.{key}", values)]
    return headers


def case_impersonation(
    bundle: PolicyBundle, caller: Identity, spec: Any, conceal: bool = True
) -> tuple[Identity, Verdict | None]:
    """A PolicyTest case's impersonation: (the identity the request is decided as, the
    case's `deny` verdict when the impersonation is refused). Raises ValueError or a
    400 StatusError for a malformed `impersonate`."""
    if not isinstance(spec, Mapping):
        raise ValueError("'impersonate' must be a mapping {user, groups, uid, tenant, extra}")
    asked = parse_impersonation(case_headers(spec))
    if asked is None:
        raise ValueError("'impersonate' needs a user")
    v = decide_impersonation(bundle, caller, asked, conceal=conceal)
    if v.error is not None:
        return caller, Verdict("deny", v.reason, bundle.engine.revision, error=v.error)
    return asked.identity(caller), None

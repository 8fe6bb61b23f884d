"""`sidecar policy diff OLD NEW`: what a policy change does to effective access.

Owns the effective-access model of a policy (per subject and region) and its diff.

- A *subject* is a binding subject (`u:{tenant}:{user}`, `g:{tenant}:{group}`, service
  accounts as users), the engine's subject keys. Changes are per subject: a caller who
  also gets the same access through another subject (another group) sees no change.
- A *region* is a part of the request space in which the same bindings of a subject
  are in force (the engine's domain lookups, `engine.request_vector`): non-resource
  URLs, the cluster level, the subject's own tenant, each namespace of it that a policy
  names, its other namespaces, and other tenants.
- An *atom* is one verb of one rule entry (one API group, resource, resource name or
  URL, unconditional or owner-only), matched with the engine's own `rule_match`.
  Resource and URL wildcards stay wildcards; verbs are expanded (there are few) and
  folded back into `*` for display.

A change is an atom gained (in force in NEW, not OLD) or lost in a set of regions, with
the `except` atoms already granted on the other side; it *covers* a request when the
atom matches it and no `except` atom does. The diff is exact: `decide()` gives a
different access (unconditional, owner-only, none) for a subject's caller in OLD and
NEW exactly when some change covers the request (property test in
`tests/sidecar/policy/tools/test_diff.py`). An owner atom only covers requests an owner rule
can decide (`rbac.owner_rule_decides`). Rate-limit and quota changes are listed per tenant,
and so are mode changes (`TenantMode`: a tenant put in or taken out of dry-run, or
moved back to the global mode; the global mode itself is the config's `mode`, not
the policy's): each is a change of behaviour, so the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget
from sidecar.policy.compile import NO_DOMAIN, OWNER_PREFIX, PLine, rule_match, split_set
from sidecar.policy.decide import normalize
from sidecar.policy.engine import PolicyEngine, request_vector, subject_keys
from sidecar.policy.kinds.modes import DRY_RUN
from sidecar.policy.rbac import NON_RESOURCE_VERBS, RESOURCE_VERBS, Rule, owner_rule_decides
from sidecar.policy.scopes import is_cluster_scoped
from sidecar.policy.source.bundle import PolicyBundle, build_bundle
from sidecar.policy.source.files import LoadResult, Problem, load_documents
from sidecar.policy.tools.apisource import ApiSourceError, add_api_options, api_layer, with_api

_RES_VERBS = tuple(sorted(RESOURCE_VERBS - {"*"}))
_URL_VERBS = tuple(sorted(NON_RESOURCE_VERBS - {"*"}))


class SourceError(Exception):
    """OLD or NEW cannot be read or does not validate (exit 2)."""


# -- atoms and regions -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Atom:
    verb: str
    api_group: str = ""
    resource: str = ""
    name: str = ""  # one resourceName, "" = any
    url: str = ""  # a nonResourceURL pattern (then resource is "")
    owner: str = ""  # owner field of an owner-only grant, "" = unconditional
    # A tenant's own owner rule at the cluster level reaches cluster-scoped objects only.
    cluster_scoped_only: bool = False
    via: str = field(default="", compare=False)

    def matches(self, target: RequestTarget, scope: str, grp: str, res: str) -> bool:
        if self.url:
            return rule_match("url", "", res, "", target.verb, "url", "", self.url, "", self.verb)
        if not rule_match(
            scope,
            grp,
            res,
            target.name,
            target.verb,
            "res",
            self.api_group,
            self.resource,
            self.name,
            self.verb,
        ):
            return False
        if self.cluster_scoped_only and not is_cluster_scoped(grp, res):
            return False
        if self.owner:
            return owner_rule_decides(target.verb, target.name)
        return True

    def within(self, other: Atom) -> bool:
        """Every request this atom matches, `other` matches too."""
        if self.verb != other.verb or bool(self.url) != bool(other.url):
            return False
        if self.url:
            o = other.url
            return o == "*" or o == self.url or (o.endswith("*") and self.url.startswith(o[:-1]))
        if other.api_group not in ("*", self.api_group):
            return False
        if other.cluster_scoped_only and not self.cluster_scoped_only:
            if "*" in self.resource or self.api_group == "*":
                return False
            if not is_cluster_scoped(self.api_group, self.resource):
                return False
        o, r = other.resource, self.resource
        sub = r.partition("/")[2]
        if not (o == "*" or o == r or (sub and o == f"*/{sub}")):
            return False
        return not other.name or other.name == self.name

    def overlaps(self, other: Atom) -> bool:
        """Whether some request could match both (a cheap over-approximation)."""
        if self.verb != other.verb or bool(self.url) != bool(other.url):
            return False
        if self.url:
            return True
        if "*" not in (self.api_group, other.api_group) and self.api_group != other.api_group:
            return False
        return not (self.name and other.name and self.name != other.name)

    def describe(self, verbs: str = "") -> str:
        verbs = verbs or self.verb
        if self.url:
            return f"{verbs} {self.url}"
        group = "core" if self.api_group == "" else self.api_group
        what = f"{verbs} {self.resource} ({'any group' if group == '*' else group})"
        if self.name:
            what += f" named {self.name}"
        if self.owner:
            what += f" [owner-only: {self.owner}]"
        if self.cluster_scoped_only:
            what += " [cluster-scoped objects only]"
        return what

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verb": self.verb}
        if self.url:
            out["nonResourceURL"] = self.url
        else:
            out.update(apiGroup=self.api_group, resource=self.resource)
            if self.name:
                out["resourceName"] = self.name
            out["ownerOnly"] = bool(self.owner)
            if self.owner:
                out["ownerField"] = self.owner
            if self.cluster_scoped_only:
                out["clusterScopedOnly"] = True
        return out


def line_atoms(line: PLine, via: str, cluster_scoped_only: bool = False) -> list[Atom]:
    """One compiled policy line as atoms (verbs, groups, resources, names expanded)."""
    _, kind, grp, res, names, verbs, cond, _ = line
    verb_set = split_set(verbs)
    if kind == "url":
        expanded = _URL_VERBS if "*" in verb_set else sorted(verb_set)
        return [Atom(v, url=u, via=via) for v in expanded for u in sorted(split_set(res))]
    expanded = _RES_VERBS if "*" in verb_set else sorted(verb_set)
    owner = cond[len(OWNER_PREFIX) :] if cond else ""
    return [
        Atom(v, g, r, n, owner=owner, cluster_scoped_only=cluster_scoped_only, via=via)
        for v in expanded
        for g in sorted(split_set(grp))
        for r in sorted(split_set(res))
        for n in (sorted(split_set(names)) if names else [""])
    ]


def rule_atoms(rule: Rule) -> list[Atom]:
    """One rule entry as atoms (for lint: shadowed rules)."""
    line: PLine = (
        "",
        "url" if rule.non_resource_urls else "res",
        ",".join(rule.api_groups),
        ",".join(rule.non_resource_urls or rule.resources),
        ",".join(rule.resource_names),
        ",".join(rule.verbs),
        OWNER_PREFIX + rule.owner_field if rule.owner else "",
        rule.rule_id,
    )
    return line_atoms(line, rule.rule_id)


@dataclass(frozen=True, slots=True)
class Region:
    key: str  # "url", "cluster", "tenant", "ns:{ns}", "ns-other", "other"
    label: str


def subject_tenant(subject: str) -> str:
    return subject.split(":", 2)[1]


def subject_label(subject: str) -> str:
    kind, tenant, name = subject.split(":", 2)
    if kind == "g":
        where = "any tenant" if tenant == "*" else f"tenant {tenant}"
        return f"Group {name} ({where})"
    if name.startswith("system:serviceaccount:"):
        ns, _, sa = name[len("system:serviceaccount:") :].partition(":")
        return f"ServiceAccount {ns}/{sa} (tenant {tenant})"
    return f"User {name} (tenant {tenant})"


def _links(engine: PolicyEngine) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """subject → domain → [(role key, binding label)]."""
    out: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for (sub, role, dom), bindings in engine.compiled.link_bindings.items():
        out.setdefault(sub, {}).setdefault(dom, []).append((role, bindings[0].label))
    return out


def _regions(subject: str, namespaces: Iterable[str]) -> list[Region]:
    tenant = subject_tenant(subject)
    out = [Region("url", "non-resource URLs"), Region("cluster", "the cluster level")]
    if tenant == "*":
        return [*out, Region("other", "every tenant")]
    out.append(Region("tenant", f"tenant {tenant} (tenant-scoped)"))
    out += [Region(f"ns:{ns}", f"namespace {tenant}/{ns}") for ns in sorted(set(namespaces))]
    out.append(Region("ns-other", f"other namespaces of tenant {tenant}"))
    return [*out, Region("other", "other tenants")]


def region_of(
    subject: str, identity: Identity, target: RequestTarget, namespaces: Iterable[str] = ()
) -> str | None:
    """The region of `subject` a request falls in (None: the request matches nothing);
    `namespaces`: those of the subject's tenant that have regions of their own."""
    vec = request_vector(identity, normalize(target, identity))
    if isinstance(vec, str):
        return None
    nd, td, scope = vec[1], vec[2], vec[3]
    if scope == "url":
        return "url"
    if scope == "cluster":
        return "cluster"
    tenant = subject_tenant(subject)
    if td != tenant:
        return "other"
    if nd == NO_DOMAIN:
        return "tenant"
    ns = nd.partition("/")[2]
    return f"ns:{ns}" if ns in set(namespaces) else "ns-other"


def _region_atoms(
    engine: PolicyEngine, links: dict[str, list[tuple[str, str]]], subject: str, region: str
) -> list[Atom]:
    tenant = subject_tenant(subject)
    lines = _lines_by_role(engine)
    picks: list[tuple[str, bool, bool]] = [("*", False, False)]  # (domain, owner only, cs only)
    if region == "cluster" and tenant != "*":
        picks.append((tenant, True, True))
    elif region in ("tenant", "ns-other") or region.startswith("ns:"):
        picks.append((tenant, False, False))
        if region.startswith("ns:"):
            picks.append((f"{tenant}/{region[3:]}", False, False))
    out: list[Atom] = []
    for dom, owner_only, cs_only in picks:
        for role, binding in links.get(dom, []):
            for line in lines.get(role, []):
                if (line[1] == "url") != (region == "url"):
                    continue
                if owner_only and not line[6]:
                    continue
                via = f"{binding} → {engine.policy.roles[role].label}"
                out += line_atoms(line, f"{via} → rule {line[7]}", cs_only)
    return out


def _lines_by_role(engine: PolicyEngine) -> dict[str, list[PLine]]:
    out: dict[str, list[PLine]] = {}
    for line in engine.compiled.p_lines:
        out.setdefault(line[0], []).append(line)
    return out


# -- the diff --------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    subject: str
    gained: bool
    atom: Atom
    regions: tuple[Region, ...]
    excepted: tuple[Atom, ...] = ()
    # The namespaces of the subject's tenant with a region of their own.
    namespaces: tuple[str, ...] = ()

    def covers(self, identity: Identity, target: RequestTarget) -> bool:
        if self.subject not in subject_keys(identity):
            return False
        region = region_of(self.subject, identity, target, self.namespaces)
        if region not in {r.key for r in self.regions}:
            return False
        vec = request_vector(identity, normalize(target, identity))
        assert not isinstance(vec, str)
        scope, grp, res = vec[3], vec[4], vec[5]
        t = normalize(target, identity)
        if not self.atom.matches(t, scope, grp, res):
            return False
        return not any(m.matches(t, scope, grp, res) for m in self.excepted)

    def as_json(self) -> dict[str, Any]:
        return {
            "subject": subject_label(self.subject),
            "change": "gained" if self.gained else "lost",
            "where": [r.label for r in self.regions],
            **self.atom.as_json(),
            "via": self.atom.via,
            "except": [m.as_json() for m in self.excepted],
        }


@dataclass
class PolicyDiff:
    changes: list[Change] = field(default_factory=list)
    rate_limits: list[str] = field(default_factory=list)
    quotas: list[str] = field(default_factory=list)
    modes: list[ModeChange] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes or self.rate_limits or self.quotas or self.modes)

    @property
    def side_lines(self) -> list[str]:
        """Rate-limit, quota and mode changes, one line each."""
        return self.rate_limits + self.quotas + [m.describe() for m in self.modes]


@dataclass(frozen=True, slots=True)
class ModeChange:
    """A tenant's mode in OLD and NEW (None: no TenantMode, the config's global mode)."""

    tenant: str
    old: str | None
    new: str | None

    def describe(self) -> str:
        def shown(mode: str | None) -> str:
            return mode if mode is not None else "the global mode (config `mode`)"

        line = f"mode of tenant {self.tenant}: {shown(self.old)} → {shown(self.new)}"
        if self.new == DRY_RUN:
            line += (
                f" (refusals inside tenant {self.tenant}: RBAC 403s, rate limits and "
                "quotas, are logged and forwarded)"
            )
        elif self.new is None:
            line += " (dry-run if the config's mode is dry-run)"
        return line

    def as_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "old": self.old, "new": self.new}


def _side_changes(gain: list[Atom], base: list[Atom]) -> list[tuple[Atom, tuple[Atom, ...]]]:
    """Atoms of `gain` not wholly granted by `base`, with the `base` atoms to except.
    An owner atom is also excepted by the base's unconditional atoms; atoms inside
    another atom reported on the same side are left out (that one covers them)."""
    found: list[tuple[Atom, tuple[Atom, ...]]] = []
    unique = list(dict.fromkeys(gain))
    for a in unique:
        relevant = [m for m in base if (not m.owner or m.owner == a.owner) and a.overlaps(m)]
        if not a.owner:
            relevant = [m for m in relevant if not m.owner]
        if any(a.within(m) for m in relevant):
            continue
        found.append((a, tuple(dict.fromkeys(relevant))))
    out = []
    for a, excepted in found:
        if any(
            b is not a and (b.owner in ("", a.owner)) and a.within(b) and not b.within(a)
            for b, _ in found
        ):
            continue
        out.append((a, excepted))
    return out


def diff_bundles(old: PolicyBundle, new: PolicyBundle) -> PolicyDiff:
    result = PolicyDiff()
    old_links, new_links = _links(old.engine), _links(new.engine)
    for subject in sorted(set(old_links) | set(new_links)):
        ol, nl = old_links.get(subject, {}), new_links.get(subject, {})
        tenant = subject_tenant(subject)
        namespaces = tuple(
            sorted({d.partition("/")[2] for d in (*ol, *nl) if d.startswith(f"{tenant}/")})
        )
        merged: dict[tuple[bool, Atom, tuple[Atom, ...], str], list[Region]] = {}
        for region in _regions(subject, namespaces):
            o = _region_atoms(old.engine, ol, subject, region.key)
            n = _region_atoms(new.engine, nl, subject, region.key)
            for gained, side, base in ((True, n, o), (False, o, n)):
                for atom, excepted in _side_changes(side, base):
                    merged.setdefault((gained, atom, excepted, atom.via), []).append(region)
        for (gained, atom, excepted, _), regions in merged.items():
            result.changes.append(
                Change(subject, gained, atom, tuple(regions), excepted, namespaces)
            )
    result.rate_limits = _rate_limit_changes(old, new)
    result.quotas = _quota_changes(old, new)
    result.modes = _mode_changes(old, new)
    return result


def _mode_changes(old: PolicyBundle, new: PolicyBundle) -> list[ModeChange]:
    o, n = old.tenant_modes, new.tenant_modes
    return [
        ModeChange(t, o.get(t), n.get(t)) for t in sorted(set(o) | set(n)) if o.get(t) != n.get(t)
    ]


def _rate_limit_changes(old: PolicyBundle, new: PolicyBundle) -> list[str]:
    out = []
    o, n = old.rate_limits, new.rate_limits
    pairs = [("default (every tenant without its own)", o.default, n.default)]
    pairs += [
        (f"tenant {t}", o.tenants.get(t), n.tenants.get(t))
        for t in sorted(set(o.tenants) | set(n.tenants))
    ]
    for who, a, b in pairs:
        da = a.describe() if a is not None else "not limited"
        db = b.describe() if b is not None else "not limited"
        if da != db:
            out.append(f"rate limit of {who}: {da} → {db}")
    return out


def _quota_changes(old: PolicyBundle, new: PolicyBundle) -> list[str]:
    out = []
    o, n = old.quotas, new.quotas
    scopes: list[tuple[str, Any, Any]] = [("defaults", o.defaults, n.defaults)]
    scopes += [
        (f"tenant {t}", o.tenants.get(t, {}), n.tenants.get(t, {}))
        for t in sorted(set(o.tenants) | set(n.tenants))
    ]
    scopes += [
        (f"namespace {t}/{ns}", o.namespaces.get((t, ns), {}), n.namespaces.get((t, ns), {}))
        for t, ns in sorted(set(o.namespaces) | set(n.namespaces))
    ]
    for who, a, b in scopes:
        for res in sorted(set(a) | set(b)):
            if a.get(res) != b.get(res):
                out.append(f"quota of {who}: {res} {a.get(res, 'unset')} → {b.get(res, 'unset')}")
    return out


# -- reading OLD and NEW ---------------------------------------------------------------


def load_source(spec: str) -> PolicyBundle:
    """A directory, or `git:REF[:PATH]` (PATH relative to the repository root, default
    `policies`), read with `git ls-tree`/`git show`: no checkout. Raises SourceError."""
    if spec.startswith("git:"):
        return _load_git(spec)
    if not Path(spec).is_dir():
        raise SourceError(f"{spec}: no such policy directory")
    return _validated(spec, load_documents([spec]))


def _validated(spec: str, result: LoadResult) -> PolicyBundle:
    bundle, problems = build_bundle(result)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SourceError(f"{spec} does not validate: {problems[0]}{more}")
    return bundle


def _git(*args: str) -> bytes:
    try:
        done = subprocess.run(["git", *args], capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceError(f"cannot run git: {exc}") from None
    if done.returncode != 0:
        msg = done.stderr.decode(errors="replace").strip().splitlines()
        raise SourceError(msg[-1] if msg else f"git {args[0]} failed")
    return done.stdout


def _load_git(spec: str) -> PolicyBundle:
    ref, _, path = spec[len("git:") :].partition(":")
    path = path or "policies"
    if not ref:
        raise SourceError(f"{spec}: no git ref (git:REF[:PATH])")
    if ref.startswith("-"):  # never let a ref become an option of git
        raise SourceError(f"{spec}: git ref {ref!r} does not exist")
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise SourceError(f"{spec}: path {path!r} is outside the repository")
    try:
        _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except SourceError:
        raise SourceError(f"{spec}: git ref {ref!r} does not exist") from None
    names = [n for n in _git("ls-tree", "-r", "-z", "--name-only", ref, "--", norm).split(b"\0")]
    files = [n.decode() for n in names if n]
    if not files:
        raise SourceError(f"{spec}: no files under {norm!r} at {ref}")
    tmp = tempfile.mkdtemp(prefix="sidecar-diff-")
    try:
        root = Path(tmp) / "p"
        for name in files:
            rel = posixpath.relpath(name, norm) if norm != "." else name
            dest = root / (rel if rel != "." else posixpath.basename(name))
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(_git("show", f"{ref}:{name}"))
        result = load_documents([root])
        prefix, shown = str(root), f"{ref}:{norm}"
        docs = [replace(d, file=d.file.replace(prefix, shown, 1)) for d in result.documents]
        problems = [
            Problem(p.file.replace(prefix, shown, 1), p.line, p.message) for p in result.problems
        ]
        return _validated(spec, LoadResult(docs, problems, result.revision))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- output ----------------------------------------------------------------------------


def _grouped(d: PolicyDiff) -> dict[str, list[tuple[bool, str, str, list[str], str]]]:
    """subject → [(gained, what, via, where, note)]: the atoms of one rule entry folded
    back into verbs by resources (verbs shown as `*` when all of them)."""
    verbs_of: dict[tuple[Any, ...], tuple[list[str], set[str]]] = {}
    for c in d.changes:
        a = c.atom
        where = tuple(r.label for r in c.regions)
        key = (c.subject, c.gained, a.via, where, replace(a, verb="*"))
        verbs, exc = verbs_of.setdefault(key, ([], set()))
        verbs.append(a.verb)
        exc.update(m.describe() for m in c.excepted)
    folded: dict[tuple[Any, ...], tuple[list[Atom], set[str]]] = {}
    for (subject, gained, via, where, a), (verbs, exc) in verbs_of.items():
        full = _URL_VERBS if a.url else _RES_VERBS
        shown = "*" if set(verbs) >= set(full) else ", ".join(sorted(set(verbs)))
        fold = (subject, gained, via, where, shown, a.name, a.owner, a.cluster_scoped_only)
        atoms, notes = folded.setdefault(fold, ([], set()))
        atoms.append(a)
        notes.update(exc)
    out: dict[str, list[tuple[bool, str, str, list[str], str]]] = {}
    for fkey, (atoms, exc) in folded.items():
        subject, gained, via, where, shown = fkey[:5]
        what = _fold(shown, atoms)
        note = ""
        if exc:
            note = ("already granted before: " if gained else "still granted: ") + "; ".join(
                sorted(exc)
            )
        out.setdefault(subject, []).append((gained, what, via, list(where), note))
    return dict(sorted(out.items()))


def _fold(verbs: str, atoms: list[Atom]) -> str:
    first = atoms[0]
    if first.url:
        return f"{verbs} {', '.join(dict.fromkeys(a.url for a in atoms))}"
    groups = list(dict.fromkeys("core" if a.api_group == "" else a.api_group for a in atoms))
    resources = list(dict.fromkeys(a.resource for a in atoms))
    if len(atoms) == len(groups) * len(resources):
        what = f"{verbs} {', '.join(resources)} ({', '.join(groups).replace('*', 'any group')})"
    else:
        what = f"{verbs} " + ", ".join(
            f"{a.resource} ({'core' if a.api_group == '' else a.api_group})" for a in atoms
        )
    if first.name:
        what += f" named {first.name}"
    if first.owner:
        what += f" [owner-only: {first.owner}]"
    if first.cluster_scoped_only:
        what += " [cluster-scoped objects only]"
    return what


def format_text(d: PolicyDiff) -> str:
    lines: list[str] = []
    for subject, entries in _grouped(d).items():
        lines.append(subject_label(subject))
        for gained, what, via, where, note in entries:
            lines.append(f"  {'+' if gained else '-'} {what} in {', '.join(where)}")
            lines.append(f"      via {via} ({'NEW' if gained else 'OLD'})")
            if note:
                lines.append(f"      {note}")
    for line in d.side_lines:
        lines.append(f"~ {line}")
    return "\n".join(lines) + ("\n" if lines else "no change of effective access\n")


def format_markdown(d: PolicyDiff, old: str, new: str) -> str:
    out = [f"### Policy diff: `{old}` → `{new}`", ""]
    if not d.changed:
        return "\n".join([*out, "No change of effective access.", ""])
    groups = _grouped(d)
    gained = sum(1 for es in groups.values() for e in es if e[0])
    out += [
        f"**{gained}** access(es) gained, **{sum(len(e) for e in groups.values()) - gained}**"
        " lost.",
        "",
    ]
    for subject, entries in groups.items():
        out += [
            f"#### {subject_label(subject)}",
            "",
            "| | access | where | grant | note |",
            "|---|---|---|---|---|",
        ]
        for g, what, via, where, note in entries:
            sign = "**gained**" if g else "**lost**"
            side = "NEW" if g else "OLD"
            out.append(f"| {sign} | `{what}` | {', '.join(where)} | {via} ({side}) | {note} |")
        out.append("")
    if d.side_lines:
        out += ["#### Rate limits, quotas and modes", ""]
        out += [f"- {line}" for line in d.side_lines]
        out.append("")
    return "\n".join(out)


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "diff",
        help="list every change of effective access between two policy trees",
        description="OLD and NEW: directories or git:REF[:PATH]. Exit 0: no change, "
        "1: changes, 2: a tree is broken.",
    )
    p.add_argument("old", metavar="OLD")
    p.add_argument("new", metavar="NEW")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object")
    fmt.add_argument("--markdown", action="store_true", help="a pull-request comment")
    add_api_options(p)  # the API objects, joined with both trees
    p.set_defaults(func=_diff_cmd)


def _diff_cmd(args: argparse.Namespace) -> int:
    try:
        old, new = load_source(args.old), load_source(args.new)
        layer = api_layer(args)
        old, new = with_api(old, layer), with_api(new, layer)
    except (SourceError, ApiSourceError) as exc:
        print(f"sidecar policy diff: {exc}", file=sys.stderr)
        return 2
    d = diff_bundles(old, new)
    if args.json:
        obj = {
            "old": {"source": args.old, "revision": old.revision},
            "new": {"source": args.new, "revision": new.revision},
            "changed": d.changed,
            "changes": [c.as_json() for c in d.changes],
            "rateLimits": d.rate_limits,
            "quotas": d.quotas,
            "modes": [m.as_json() for m in d.modes],
        }
        print(json.dumps(obj, indent=None))
    elif args.markdown:
        sys.stdout.write(format_markdown(d, args.old, args.new))
    else:
        sys.stdout.write(format_text(d))
    return 1 if d.changed else 0


__all__ = [
    "Atom",
    "Change",
    "ModeChange",
    "PolicyDiff",
    "SourceError",
    "diff_bundles",
    "load_source",
]

"""Benchmark of the policy engine: decision time (cache hit / miss) and load time.

Generates policies of 1k / 10k / 100k compiled lines (half rule lines, half binding
links) across 10 / 1,000 / 10,000 tenants as YAML files, then measures:
- load: reading the YAML (PyYAML's libyaml loader) + validating it and building the
  engine (index included), split into parse and compile;
- miss: `decide` with a `DecisionCache` for a request not in the cache (index + matcher);
- hit: the same call once the decision is cached.
About 45% of the generated requests are denials. DESIGN §11 targets at 100k lines /
10k tenants: p99 ≤ 20 µs on a hit, ≤ 250 µs on a miss, load + compile ≤ 6 s. The
reload pause (the event loop's longest stall while a reload runs) is `reload_pause.py`.

    python loadtests/bench_policy.py [--requests N] [--only 1k]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope
from sidecar.policy.decide import decide
from sidecar.policy.engine import DecisionCache, compile_engine
from sidecar.policy.source.files import load_documents

SIZES = [("1k", 1_000, 10), ("10k", 10_000, 1_000), ("100k", 100_000, 10_000)]
RESOURCES = ["pods", "services", "configmaps", "secrets", "servers", "bays", "jobs", "events"]
VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
NAMESPACES = ["dev", "prod", "test"]
RULES_PER_ROLE = 5
SUBJECTS_PER_BINDING = 5


def generate(lines: int, tenants: int, rnd: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """YAML text with about `lines` compiled lines, and the (tenant, user) subjects."""
    per_tenant = max(2, lines // tenants)
    rules = per_tenant // 2
    links = per_tenant - rules
    out: list[str] = []
    users: list[tuple[str, str]] = []
    # A few shared ClusterRoles, bound by tenants' RoleBindings.
    out.append(
        "kind: ClusterRole\nmetadata: {name: view}\nrules:\n"
        "- apiGroups: ['']\n  resources: [pods, services, events]\n"
        "  verbs: [get, list, watch]\n"
    )
    for t in range(tenants):
        tenant = f"t{t}"
        roles = []
        for r in range(max(1, rules // RULES_PER_ROLE)):
            n = min(RULES_PER_ROLE, rules - r * RULES_PER_ROLE) or 1
            body = []
            for _ in range(n):
                res = rnd.sample(RESOURCES, 2)
                verbs = rnd.sample(VERBS, 3)
                body.append(
                    f"- apiGroups: ['', compute]\n  resources: [{', '.join(res)}]\n"
                    f"  verbs: [{', '.join(verbs)}]\n"
                )
            name = f"role{r}"
            roles.append(name)
            out.append(
                f"kind: TenantRole\nmetadata: {{tenant: {tenant}, name: {name}}}\n"
                f"rules:\n{''.join(body)}"
            )
        for b in range(max(1, links // SUBJECTS_PER_BINDING)):
            n = min(SUBJECTS_PER_BINDING, links - b * SUBJECTS_PER_BINDING) or 1
            subs = []
            for s in range(n):
                user = f"u{b}-{s}"
                users.append((tenant, user))
                subs.append(f"- {{kind: User, name: {user}}}\n")
            if b % 2:
                ns = rnd.choice(NAMESPACES)
                ref = rnd.choice([("TenantRole", rnd.choice(roles)), ("ClusterRole", "view")])
                out.append(
                    f"kind: RoleBinding\nmetadata: {{tenant: {tenant}, namespace: {ns}, "
                    f"name: b{b}}}\nroleRef: {{kind: {ref[0]}, name: {ref[1]}}}\n"
                    f"subjects:\n{''.join(subs)}"
                )
            else:
                out.append(
                    f"kind: TenantRoleBinding\nmetadata: {{tenant: {tenant}, "
                    f"name: b{b}}}\nroleRef: {{kind: TenantRole, "
                    f"name: {rnd.choice(roles)}}}\nsubjects:\n{''.join(subs)}"
                )
    return "---\n".join(out), users


def requests(
    users: list[tuple[str, str]], n: int, rnd: random.Random
) -> list[tuple[Identity, RequestTarget]]:
    out = []
    for i in range(n):
        tenant, user = rnd.choice(users)
        if rnd.random() < 0.1:
            tenant = f"t{rnd.randrange(10**6)}"  # a caller whose bindings are elsewhere
        scope = Scope.NAMESPACE if rnd.random() < 0.8 else Scope.TENANT
        target = RequestTarget(
            path="/bench",
            verb=rnd.choice(VERBS),
            resource_request=True,
            api_group=rnd.choice(["", "compute"]),
            api_version="v1",
            scope=scope,
            tenant=tenant,
            namespace=rnd.choice(NAMESPACES) if scope == Scope.NAMESPACE else None,
            resource=rnd.choice(RESOURCES),
            name=f"obj{i}",
        )
        out.append((Identity(user, tenant), target))
    return out


def pct(samples: list[float], q: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(q * len(samples)))]


def bench(label: str, lines: int, tenants: int, n: int) -> dict[str, object]:
    rnd = random.Random(lines)
    text, users = generate(lines, tenants, rnd)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.yaml"
        path.write_text(text)
        t0 = time.perf_counter()
        result = load_documents([tmp])
        t1 = time.perf_counter()
        engine, problems = compile_engine(result.documents, result.revision)
        t2 = time.perf_counter()
    assert not problems, (problems[:3], result.problems[:3])
    assert not result.problems, (problems[:3], result.problems[:3])
    reqs = requests(users, n, rnd)
    cache = DecisionCache(maxsize=n * 2)
    timer = time.perf_counter_ns
    for ident, target in reqs[:200]:  # warm the code paths, not the cache
        decide(engine, ident, target)
    miss: list[float] = []
    allowed = 0
    for ident, target in reqs:
        s = timer()
        d = decide(engine, ident, target, cache=cache)
        miss.append((timer() - s) / 1000)
        allowed += d.allowed
    hit: list[float] = []
    for ident, target in reqs:
        s = timer()
        decide(engine, ident, target, cache=cache)
        hit.append((timer() - s) / 1000)
    return {
        "size": label,
        "lines": engine.line_count,
        "yaml_lines": text.count("\n") + 1,
        "yaml_bytes": len(text.encode()),
        "tenants": tenants,
        "load_s": t2 - t0,
        "parse_s": t1 - t0,
        "compile_s": t2 - t1,
        "miss_p50": statistics.median(miss),
        "miss_p99": pct(miss, 0.99),
        "hit_p50": statistics.median(hit),
        "hit_p99": pct(hit, 0.99),
        "deny_pct": 100 * (1 - allowed / len(reqs)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--only", choices=[s[0] for s in SIZES])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    results = []
    print(
        "| policy | compiled lines | tenants | load (parse + compile) | miss p50 / p99 "
        "| hit p50 / p99 | denied |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, lines, tenants in SIZES:
        if args.only and label != args.only:
            continue
        r = bench(label, lines, tenants, args.requests)
        results.append(r)
        print(
            f"| {r['size']} | {r['lines']:,} | {r['tenants']:,} "
            f"| {r['load_s']:.2f} s ({r['parse_s']:.2f} + {r['compile_s']:.2f}) "
            f"| {r['miss_p50']:.1f} / {r['miss_p99']:.1f} µs "
            f"| {r['hit_p50']:.1f} / {r['hit_p99']:.1f} µs | {r['deny_pct']:.0f}% |",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

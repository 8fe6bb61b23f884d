"""Benchmark of the API policy source (DESIGN §5, §11; issue 30 item 5).

10,000 RoleBindings (and 5,000 Roles) stored through the API over 1,000 tenants, joined
with the shipped policy files, as every sidecar joins them:
- build: compiling every tenant's objects and joining them with the files (start-up);
- change: one tenant's objects changed (a binding added), that tenant compiled again
  and joined with everything else: what a replica does per change (target ≤ 50 ms);
- decisions: `decide` with a `DecisionCache` on the joined policy, miss and hit (the
  §11 targets: p99 ≤ 250 µs on a miss, ≤ 20 µs on a hit), about half of them denials.

    python loadtests/bench_api_policy.py [--tenants 1000] [--bindings 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.core.identity import Identity
from sidecar.core.target import RequestTarget, Scope
from sidecar.policy.decide import decide
from sidecar.policy.engine import DecisionCache
from sidecar.policy.source.api import (
    ApiLayer,
    StoredObject,
    TenantUnit,
    compile_tenant,
    compose_bundle,
)
from sidecar.policy.source.bundle import load_bundle

ROOT = Path(__file__).resolve().parent.parent
RESOURCES = ["pods", "services", "configmaps", "secrets", "servers", "bays"]
VERBS = ["get", "list", "watch", "create", "update", "delete"]
NAMESPACES = ["dev", "prod"]


def tenant_objects(t: int, bindings: int, extra: int = 0) -> list[StoredObject]:
    tenant = f"t{t}"
    objs: list[StoredObject] = []
    roles = max(1, bindings // 2)
    for r in range(roles):
        ns = NAMESPACES[r % 2]
        rules = [
            {"apiGroups": [""], "resources": [RESOURCES[(r + i) % 6]], "verbs": VERBS[: 2 + i]}
            for i in range(3)
        ]
        objs.append(
            StoredObject(
                "Role", tenant, ns, f"role{r}", {"metadata": {"name": f"role{r}"}, "rules": rules}
            )
        )
    for b in range(bindings + extra):
        r = b % roles
        ns = NAMESPACES[r % 2]
        body = {
            "metadata": {"name": f"rb{b}"},
            "roleRef": {"kind": "Role", "name": f"role{r}"},
            "subjects": [{"kind": "User", "name": f"u{b}"}, {"kind": "Group", "name": f"g{b % 3}"}],
        }
        objs.append(StoredObject("RoleBinding", tenant, ns, f"rb{b}", body, str(b)))
    return objs


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"median": statistics.median(ordered), "p99": at(0.99), "max": ordered[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--bindings", type=int, default=10, help="RoleBindings per tenant")
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rng = random.Random(7)

    files, problems = load_bundle([ROOT / "policies"])
    assert not problems, problems
    started = time.perf_counter()
    units: dict[str, TenantUnit] = {
        f"t{t}": compile_tenant(f"t{t}", tenant_objects(t, args.bindings))
        for t in range(args.tenants)
    }
    layer = ApiLayer(units, "start", args.tenants * args.bindings)
    bundle, notes = compose_bundle(files, layer)
    build_s = time.perf_counter() - started
    gc.freeze()  # as the sidecar does after each join (sidecar/services/apipolicy.py)
    assert not notes, notes[:3]
    api_bindings = len(bundle.engine.policy.bindings) - len(files.engine.policy.bindings)

    # One tenant's change: compile it again and join it with all the others.
    change_ms: list[float] = []
    for i in range(args.changes):
        t = rng.randrange(args.tenants)
        begin = time.perf_counter()
        unit = compile_tenant(f"t{t}", tenant_objects(t, args.bindings, extra=1 + i % 2))
        changed = dict(layer.units)
        changed[f"t{t}"] = unit
        layer = ApiLayer(changed, f"c{i}", layer.objects + 1)
        bundle, _ = compose_bundle(files, layer)
        change_ms.append((time.perf_counter() - begin) * 1000)
        gc.freeze()

    # Decisions on the joined policy.
    cache = DecisionCache(1_000_000)
    requests: list[tuple[Identity, RequestTarget]] = []
    for _ in range(args.requests):
        t = rng.randrange(args.tenants)
        b = rng.randrange(args.bindings)
        identity = Identity(f"u{b}", f"t{t}", (f"g{rng.randrange(3)}",))
        target = RequestTarget(
            path="",
            verb=rng.choice(VERBS),
            resource_request=True,
            api_version="v1",
            scope=Scope.NAMESPACE,
            tenant=f"t{t}",
            namespace=rng.choice(NAMESPACES),
            resource=rng.choice(RESOURCES),
        )
        requests.append((identity, target))
    miss_us: list[float] = []
    denied = 0
    for identity, target in requests:
        begin = time.perf_counter()
        v = decide(bundle, identity, target, cache=cache)
        miss_us.append((time.perf_counter() - begin) * 1e6)
        denied += not v.allowed
    hit_us: list[float] = []
    for identity, target in requests:
        begin = time.perf_counter()
        decide(bundle, identity, target, cache=cache)
        hit_us.append((time.perf_counter() - begin) * 1e6)

    figures: dict[str, Any] = {
        "tenants": args.tenants,
        "apiBindings": api_bindings,
        "apiRoles": len(bundle.engine.policy.roles) - len(files.engine.policy.roles),
        "buildSeconds": round(build_s, 3),
        "changeMs": {k: round(v, 2) for k, v in percentiles(change_ms).items()},
        "missUs": {k: round(v, 1) for k, v in percentiles(miss_us).items()},
        "hitUs": {k: round(v, 1) for k, v in percentiles(hit_us).items()},
        "denied": round(denied / len(requests), 2),
    }
    print(
        f"API policy: {figures['apiBindings']} bindings, {figures['apiRoles']} roles over "
        f"{args.tenants} tenants (+ the shipped files)\n"
        f"  build (all tenants compiled and joined): {figures['buildSeconds']} s\n"
        f"  one tenant's change applied: median {figures['changeMs']['median']} ms, "
        f"p99 {figures['changeMs']['p99']} ms (target <= 50 ms)\n"
        f"  decision miss: median {figures['missUs']['median']} us, "
        f"p99 {figures['missUs']['p99']} us (target <= 250 us)\n"
        f"  decision hit:  median {figures['hitUs']['median']} us, "
        f"p99 {figures['hitUs']['p99']} us (target <= 20 us)\n"
        f"  denied: {figures['denied']:.0%}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

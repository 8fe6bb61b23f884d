"""`sidecar quota defaults|list|show|update|usage|reconcile`: the quota API's operations
for operators on the host, straight against the configured ledger and policy files.

Each command takes `--config FILE` (the sidecar's config: ledger URL, policies,
upstream; or the file named by `SIDECAR_CONFIG`) and `--policies DIR` to override the
policy directory; output is a table, or JSON with `--json`. Without a config file the
commands refuse (exit 2) and touch nothing: the built-in defaults would open a new
empty ledger in `./.sidecar/` and show zero usage while the running sidecar has real
usage (`defaults` alone also runs on `--policies DIR`: it reads no ledger). `update`
checks that the tenant exists in the backing store (skip with `--force` when it is
down); `reconcile` lists the backing store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from sidecar.config.settings import CONFIG_FILE_ENV, Config, ConfigError, load_config
from sidecar.core.quantities import format_units
from sidecar.core.status import StatusError
from sidecar.edge.quota_api import QuotaService, upstream_tenant_check
from sidecar.policy.kinds.quotas import QuotaPolicy
from sidecar.policy.source.bundle import load_bundle
from sidecar.services.metrics import Metrics
from sidecar.services.quota.factory import open_ledger
from sidecar.services.quota.ledger import Ledger, LedgerError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            default=None,
            help=f"the running sidecar's config file (default: ${CONFIG_FILE_ENV})",
        )
        p.add_argument("--policies", default=None, help="policy directory (overrides config)")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("defaults", help="the QuotaDefaults in force")
    common(p)
    p.set_defaults(func=lambda a: _run(a, _defaults))

    p = sub.add_parser("list", help="every tenant's limits")
    common(p)
    p.set_defaults(func=lambda a: _run(a, _list))

    p = sub.add_parser("show", help="a tenant's (or namespace's) limits and usage")
    common(p)
    p.add_argument("tenant")
    p.add_argument("--namespace", default="")
    p.set_defaults(func=lambda a: _run(a, _show))

    p = sub.add_parser("usage", help="a tenant's usage, per namespace")
    common(p)
    p.add_argument("tenant")
    p.add_argument("--namespace", default="")
    p.set_defaults(func=lambda a: _run(a, _usage))

    p = sub.add_parser("update", help="set a hard limit (persisted in the ledger)")
    common(p)
    p.add_argument("tenant")
    p.add_argument("resource")
    p.add_argument("hard_limit", help="a number or quantity (8, 500m, 16Gi); 'none' removes it")
    p.add_argument("--namespace", default="")
    p.add_argument(
        "--force",
        action="store_true",
        help="do not check that the tenant exists in the backing store",
    )
    p.set_defaults(func=lambda a: _run(a, _update))

    p = sub.add_parser("reconcile", help="recount usage from the backing store")
    common(p)
    p.add_argument("--tenant", default=None)
    p.set_defaults(func=lambda a: _run(a, _reconcile))


Op = Callable[[argparse.Namespace, "Env"], Awaitable[Any]]


class Env:
    def __init__(self, config: Config, policy: QuotaPolicy, ledger: Ledger) -> None:
        self.config = config
        self.policy = policy
        self.ledger = ledger
        self.metrics = Metrics()
        from sidecar.edge.proxy import Upstream

        self.upstream = Upstream(config, self.metrics)
        self.force = False

    async def tenant_exists(self, tenant: str) -> bool:
        return self.force or await upstream_tenant_check(self.upstream)(tenant)

    def service(self) -> QuotaService:
        return QuotaService(self.ledger, lambda: self.policy, self.tenant_exists)


NO_CONFIG = (
    "sidecar quota: which sidecar? Give the running sidecar's config file with "
    f"--config FILE (or set {CONFIG_FILE_ENV}=FILE), e.g. "
    "`sidecar quota list --config /etc/sidecar/config/sidecar.yaml`; with the shipped "
    "Kubernetes manifests, whose sidecar container sets SIDECAR_CONFIG: "
    "`kubectl -n tenant-api exec deploy/tenant-api -c sidecar -- sidecar quota list`. "
    "Without one this command would open a "
    "new, empty ledger, not the one the sidecar uses; nothing was read or created."
)


def config_path(args: argparse.Namespace) -> str | None:
    """The config file the command was pointed at: `--config`, else `SIDECAR_CONFIG`."""
    given = args.config or os.environ.get(CONFIG_FILE_ENV, "")
    return given or None


def _run(args: argparse.Namespace, op: Op) -> int:
    path = config_path(args)
    if path is None and not (op is _defaults and args.policies):
        print(NO_CONFIG, file=sys.stderr)
        return 2
    try:
        overrides = {"policies": args.policies} if args.policies else {}
        config = load_config(path, overrides=overrides)
    except ConfigError as exc:
        print(f"sidecar quota: {exc}", file=sys.stderr)
        return 2
    bundle, problems = load_bundle([config.policies])
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print("sidecar quota: the policy does not load", file=sys.stderr)
        return 1

    if op is _defaults:  # the policy's defaults only: no ledger, no store
        hard = bundle.quotas.defaults
        data = {"hard": {r: format_units(r, n) for r, n in sorted(hard.items())}}
        return _print(args, data, _defaults_table)

    async def main() -> Any:
        ledger = open_ledger(
            config.ledger,
            config.quota.reservation_ttl_seconds,
            redis_prefix=config.quota.redis_prefix,
        )
        env = Env(config, bundle.quotas, ledger)
        env.force = bool(getattr(args, "force", False))
        try:
            return await op(args, env)
        finally:
            await env.upstream.close()
            await ledger.close()

    try:
        result = asyncio.run(main())
    except StatusError as exc:
        print(f"sidecar quota: {exc.message}", file=sys.stderr)
        return 1 if exc.code < 500 else 3
    except LedgerError as exc:
        print(f"sidecar quota: {exc.detail}", file=sys.stderr)
        return 3
    if isinstance(result, int):
        return result
    return 0


def _print(args: argparse.Namespace, data: Any, table: Callable[[Any], str]) -> int:
    print(json.dumps(data, indent=2) if args.json else table(data))
    return 0


def _cell(v: Any) -> str:
    return "-" if v is None else str(v)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[_cell(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


_SHOW_HEADERS = ["RESOURCE", "HARD_LIMIT", "USED", "IN_PROGRESS", "AVAILABLE", "OVERAGE", "SOURCE"]


def _show_rows(data: dict[str, Any], with_tenant: bool = False) -> list[list[Any]]:
    return [
        ([data["tenant"]] if with_tenant else [])
        + [
            q["resource"],
            q["hard_limit"],
            q["used"],
            q["in_progress"],
            q["available"],
            q["overage"],
            q["source"],
        ]
        for q in data["quotas"]
    ]


def _defaults_table(data: dict[str, Any]) -> str:
    return _table(["RESOURCE", "HARD_LIMIT"], [[r, v] for r, v in data["hard"].items()])


async def _defaults(args: argparse.Namespace, env: Env) -> int:
    """Never called: `_run` answers `defaults` from the policy alone (no ledger)."""
    return _print(args, env.service().defaults(), _defaults_table)


async def _list(args: argparse.Namespace, env: Env) -> int:
    data = await env.service().list()
    return _print(
        args,
        data,
        lambda d: _table(
            ["TENANT", *_SHOW_HEADERS],
            [row for item in d["items"] for row in _show_rows(item, True)],
        ),
    )


async def _show(args: argparse.Namespace, env: Env) -> int:
    data = await env.service().show(args.tenant, args.namespace)
    return _print(args, data, lambda d: _table(_SHOW_HEADERS, _show_rows(d)))


async def _usage(args: argparse.Namespace, env: Env) -> int:
    data = await env.service().usage(args.tenant, args.namespace)

    def table(d: dict[str, Any]) -> str:
        rows = [
            ["(tenant)" if not args.namespace else args.namespace, r, v["used"], v["in_progress"]]
            for r, v in d["usage"].items()
        ]
        for ns, per in d.get("namespaces", {}).items():
            rows += [[ns, r, v["used"], v["in_progress"]] for r, v in per.items()]
        return _table(["SCOPE", "RESOURCE", "USED", "IN_PROGRESS"], rows)

    return _print(args, data, table)


async def _update(args: argparse.Namespace, env: Env) -> int:
    value: Any = args.hard_limit
    if value.lower() in ("none", "null"):
        value = None
    elif value.lstrip("-").isdigit():
        value = int(value)
    data = await env.service().update(
        args.tenant, args.namespace, args.resource, {"hard_limit": value}
    )
    return _print(args, data, lambda d: _table(_SHOW_HEADERS, _show_rows(d)))


async def _reconcile(args: argparse.Namespace, env: Env) -> int:
    from sidecar.services.quota.reconcile import ReconcileError, reconcile, upstream_fetch

    try:
        results = await reconcile(env.ledger, upstream_fetch(env.upstream), args.tenant)
    except ReconcileError as exc:
        print(f"sidecar quota reconcile: {exc}", file=sys.stderr)
        return 1
    data = {
        t: {
            "added": r.added,
            "removed": r.removed,
            "changed": r.changed,
            "before": r.before,
            "after": r.after,
        }
        for t, r in results.items()
    }
    return _print(
        args,
        data,
        lambda d: _table(
            ["TENANT", "ADDED", "REMOVED", "CHANGED", "USED_BEFORE", "USED_AFTER"],
            [
                [
                    t,
                    v["added"],
                    v["removed"],
                    v["changed"],
                    json.dumps(v["before"], sort_keys=True),
                    json.dumps(v["after"], sort_keys=True),
                ]
                for t, v in d.items()
            ],
        ),
    )

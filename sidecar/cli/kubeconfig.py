"""`sidecar kubeconfig`: an operator's kubeconfig with one context per tenant (DESIGN §3).

Stock kubectl cannot name a tenant, and an operator's short path means tenant
`default`. A server URL ending in `/tenants/{t}` addresses tenant `{t}` for every short
path, so this command writes, for each `--tenant T`, a cluster `T` whose server is
`URL/tenants/T` and a context `T` using it:

    sidecar kubeconfig --server https://sidecar:8443 --token-file ~/.sidecar/token \\
        --ca-file ca.crt --tenant acme --tenant beta > ~/.kube/sidecar
    kubectl --kubeconfig ~/.kube/sidecar --context acme label cm web tier=front

Without `--tenant` the one context is the plain server URL (short paths mean tenant
`default`). `--as USER --as-tenant T [--as-group G]…` adds a context `USER@T` that
impersonates USER of tenant T (in groups G): kubectl has no flag for the tenant, only
the kubeconfig's `as-user-extra: {tenant: [T]}` (`kubectl --as USER` alone impersonates
USER of the operator's own tenant, `system`). The token is referenced (`tokenFile`),
never copied, so rotating the file needs no new kubeconfig; the CA likewise
(`certificate-authority`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from sidecar.core.target import is_dns1123_label

__all__ = ["KubeconfigError", "build", "register"]

USER = "operator"


class KubeconfigError(ValueError):
    """Arguments that make no usable kubeconfig; the message says what to change."""


def _server(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise KubeconfigError(f"--server must be an http(s) URL, e.g. https://sidecar:8443 ({url})")
    if parts.query or parts.fragment:
        raise KubeconfigError("--server takes no query or fragment")
    segments = [s for s in parts.path.split("/") if s]
    if len(segments) >= 2 and segments[-2] == "tenants":
        raise KubeconfigError("--server is the sidecar's URL; name tenants with --tenant")
    return url.rstrip("/")


def _tenant(value: str, flag: str) -> str:
    if not is_dns1123_label(value):
        raise KubeconfigError(f"{flag} {value!r} is not a tenant name (a DNS-1123 label)")
    return value


def build(
    server: str,
    token_file: str,
    tenants: list[str],
    *,
    ca_file: str | None = None,
    namespace: str | None = None,
    as_user: str | None = None,
    as_tenant: str | None = None,
    as_groups: list[str] | None = None,
) -> dict[str, Any]:
    """The kubeconfig document. Raises `KubeconfigError` for unusable arguments."""
    base = _server(server)
    tenants = [_tenant(t, "--tenant") for t in tenants]
    if len(set(tenants)) != len(tenants):
        raise KubeconfigError("each --tenant may be given once")
    if (as_user is None) != (as_tenant is None):
        raise KubeconfigError(
            "--as and --as-tenant go together: `--as alice` alone would impersonate alice "
            "of your own tenant (system), not a tenant's user"
        )
    if as_tenant is not None:
        _tenant(as_tenant, "--as-tenant")
    if as_user is not None and not as_user.strip():
        raise KubeconfigError("--as needs a user name")
    if as_groups and as_user is None:
        raise KubeconfigError("--as-group needs --as (kubectl impersonates groups of a user)")

    def cluster(name: str, url: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"server": url}
        if ca_file:
            entry["certificate-authority"] = str(Path(ca_file).resolve())
        return {"name": name, "cluster": entry}

    def context(name: str, cluster_name: str, user: str) -> dict[str, Any]:
        ctx: dict[str, Any] = {"cluster": cluster_name, "user": user}
        if namespace:
            ctx["namespace"] = namespace
        return {"name": name, "context": ctx}

    token = str(Path(token_file).expanduser().resolve())
    clusters: list[dict[str, Any]] = []
    contexts: list[dict[str, Any]] = []
    users: list[dict[str, Any]] = [{"name": USER, "user": {"tokenFile": token}}]
    for tenant in tenants:
        clusters.append(cluster(tenant, f"{base}/tenants/{tenant}"))
        contexts.append(context(tenant, tenant, USER))
    if not tenants or as_user is not None:
        clusters.append(cluster("sidecar", base))
    if not tenants:
        contexts.append(context("sidecar", "sidecar", USER))
    if as_user is not None and as_tenant is not None:
        name = f"{as_user}@{as_tenant}"
        acting: dict[str, Any] = {"tokenFile": token, "as": as_user}
        if as_groups:
            acting["as-groups"] = list(as_groups)
        acting["as-user-extra"] = {"tenant": [as_tenant]}
        users.append({"name": name, "user": acting})
        contexts.append(context(name, "sidecar", name))
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "users": users,
        "contexts": contexts,
        "current-context": contexts[0]["name"],
    }


def register(sub: Any) -> None:
    """Adds `kubeconfig` to the `sidecar` command's subparsers."""
    cmd = sub.add_parser(
        "kubeconfig",
        help="write an operator kubeconfig: one context per tenant, or impersonating a user",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("--server", required=True, help="the sidecar's URL, e.g. https://h:8443")
    cmd.add_argument("--token-file", required=True, help="a file holding the bearer token")
    cmd.add_argument(
        "--tenant", action="append", default=[], help="a context for this tenant (repeatable)"
    )
    cmd.add_argument("--ca-file", help="the CA that signed the sidecar's certificate")
    cmd.add_argument("--namespace", help="the contexts' namespace")
    cmd.add_argument("--as", dest="as_user", help="a context impersonating this user ...")
    cmd.add_argument("--as-tenant", help="... of this tenant (as-user-extra: {tenant: [T]})")
    cmd.add_argument(
        "--as-group", action="append", default=[], help="... in this group (repeatable)"
    )
    cmd.add_argument("--output", "-o", help="write here (mode 0600) instead of stdout")
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        doc = build(
            args.server,
            args.token_file,
            list(args.tenant),
            ca_file=args.ca_file,
            namespace=args.namespace,
            as_user=args.as_user,
            as_tenant=args.as_tenant,
            as_groups=list(args.as_group),
        )
    except KubeconfigError as exc:
        print(f"sidecar kubeconfig: {exc}", file=sys.stderr)
        return 2
    text = yaml.safe_dump(doc, sort_keys=False)
    if args.output:
        out = Path(args.output)
        out.write_text(text)
        out.chmod(0o600)
        names = ", ".join(c["name"] for c in doc["contexts"])
        print(f"wrote {out}: contexts {names} (kubectl --kubeconfig {out} --context NAME …)")
    else:
        sys.stdout.write(text)
    return 0

"""The API policy source for the offline tools (DESIGN §5, issue 30 item 6).

`sidecar policy explain|who-can|can-i|diff` take, besides the policy directory, the
policy objects stored through the API: `--api URL --token-file F` reads them from a
running sidecar (or store) with that bearer token, `--api-dump FILE` from a dump made
by `sidecar policy dump-api --api URL --token-file F [-o FILE]`. They are joined with
the files exactly as a sidecar joins them (`sidecar/policy/source/api.py`).

Through a sidecar, the objects read are those the token may list: a tenant admin's
token reads its own tenant's (the cluster-level lists of a tenant user are its own
tenant's, DESIGN §3), an operator's every tenant's.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sidecar.policy.source.api import (
    KINDS,
    NAMESPACED,
    ApiLayer,
    StoredObject,
    compile_tenant,
    compose_bundle,
    digest_of,
)
from sidecar.policy.source.bundle import PolicyBundle

DUMP_KIND = "SidecarApiPolicyDump"
MAX_DUMP_BYTES = 256 * 1024 * 1024


class ApiSourceError(Exception):
    """The API source could not be read; the message says why (no secrets)."""


def add_api_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("policy objects stored through the API")
    group.add_argument("--api", default=None, metavar="URL", help="a sidecar or store URL")
    group.add_argument("--token-file", default=None, metavar="FILE", help="bearer token for --api")
    group.add_argument(
        "--api-dump", default=None, metavar="FILE", help="a dump from `sidecar policy dump-api`"
    )
    group.add_argument(
        "--ca-file", default=None, metavar="FILE", help="CA bundle for an https --api"
    )


VALUED_API_OPTIONS = frozenset({"--api", "--token-file", "--api-dump", "--ca-file"})


def _path(group: str, resource: str) -> str:
    return f"/apis/{group}/v1/{resource}" if group else f"/api/v1/{resource}"


def fetch(url: str, token_file: str | None, ca_file: str | None = None) -> dict[str, Any]:
    """Every followed kind's list from `url`, as a dump document."""
    token = ""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ApiSourceError(f"cannot read the token file: {exc.strerror}") from None
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https") else None
    kinds: dict[str, list[Any]] = {}
    for (group, resource), kind in KINDS.items():
        request = urllib.request.Request(url.rstrip("/") + _path(group, resource))
        request.add_header("Accept", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as resp:
                raw = resp.read(MAX_DUMP_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                kinds[kind] = []
                continue
            raise ApiSourceError(f"listing {resource} answered {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiSourceError(f"cannot reach the API: {getattr(exc, 'reason', exc)}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ApiSourceError(f"listing {resource} did not answer JSON") from None
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise ApiSourceError(f"listing {resource} did not answer a list")
        kinds[kind] = items
    return {"kind": DUMP_KIND, "apiVersion": "v1", "kinds": kinds}


def read_dump(path: str) -> dict[str, Any]:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ApiSourceError(f"cannot read the dump: {exc.strerror}") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ApiSourceError("the dump is not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != DUMP_KIND:
        raise ApiSourceError(f"the dump is not a {DUMP_KIND} (sidecar policy dump-api)")
    if not isinstance(doc.get("kinds"), dict):
        raise ApiSourceError("the dump has no 'kinds'")
    return doc


def stored_objects(dump: dict[str, Any]) -> list[StoredObject]:
    out: list[StoredObject] = []
    known = set(KINDS.values())
    for kind, items in dump["kinds"].items():
        if kind not in known or not isinstance(items, list):
            continue
        for obj in items:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            if not isinstance(meta, dict):
                continue
            name, tenant = meta.get("name"), meta.get("tenant")
            namespace = meta.get("namespace", "") if kind in NAMESPACED else ""
            if not all(isinstance(v, str) and v for v in (name, tenant)):
                continue
            if not isinstance(namespace, str):
                continue
            rv = str(meta.get("resourceVersion") or "")
            out.append(StoredObject(kind, str(tenant), namespace, str(name), obj, rv))
    return out


def layer_of(objects: Iterable[StoredObject]) -> ApiLayer:
    items = list(objects)
    by_tenant: dict[str, list[StoredObject]] = {}
    for obj in items:
        by_tenant.setdefault(obj.tenant, []).append(obj)
    units = {t: compile_tenant(t, objs) for t, objs in by_tenant.items()}
    return ApiLayer(units, digest_of(items), len(items))


def api_layer(args: argparse.Namespace) -> ApiLayer | None:
    """The API objects the command's options name (None: no API source given)."""
    if getattr(args, "api_dump", None):
        return layer_of(stored_objects(read_dump(args.api_dump)))
    if getattr(args, "api", None):
        return layer_of(stored_objects(fetch(args.api, args.token_file, args.ca_file)))
    return None


def with_api(bundle: PolicyBundle, layer: ApiLayer | None) -> PolicyBundle:
    if layer is None:
        return bundle
    joined, notes = compose_bundle(bundle, layer)
    for note in notes:
        print(f"API object skipped: {note}", file=sys.stderr)
    return joined


def add_dump_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dump-api",
        help="dump the policy objects stored through the API (for --api-dump)",
    )
    p.add_argument("--api", required=True, metavar="URL")
    p.add_argument("--token-file", default=None, metavar="FILE")
    p.add_argument("--ca-file", default=None, metavar="FILE")
    p.add_argument("-o", "--output", default="-", metavar="FILE")
    p.set_defaults(func=_dump_cmd)


def _dump_cmd(args: argparse.Namespace) -> int:
    try:
        dump = fetch(args.api, args.token_file, args.ca_file)
    except ApiSourceError as exc:
        print(f"sidecar policy dump-api: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(dump, indent=1, sort_keys=True) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0

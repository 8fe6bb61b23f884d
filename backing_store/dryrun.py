"""`dryRun` (DESIGN §7, §10): whether a write request is a dry run.

Kubernetes takes `?dryRun=All` on create, update, patch, delete and deletecollection,
and on a delete also `"dryRun": ["All"]` inside a DeleteOptions body (which is where
kubectl puts it for `kubectl delete --dry-run=server`). `All` is the only value;
anything else (an empty value included) is 400. The store runs a dry-run write in a
transaction that rolls back (`Store.tx(dry_run=True)`), so it validates exactly as a
real write does and keeps nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from .errors import bad_request

DRY_RUN_ALL = "All"


def _check(values: Sequence[object]) -> bool:
    for value in values:
        if value != DRY_RUN_ALL:
            raise bad_request(
                f"invalid dryRun value {value!r}: the only supported value is {DRY_RUN_ALL!r}"
            )
    return bool(values)


def is_dry_run(request: web.Request, delete_options: Any = None) -> bool:
    """True for `dryRun=All` in the query or a DeleteOptions body; 400 for other values."""
    dry = _check(request.query.getall("dryRun", []))
    if isinstance(delete_options, dict) and "dryRun" in delete_options:
        values = delete_options["dryRun"]
        if not isinstance(values, list):
            raise bad_request('DeleteOptions.dryRun must be a list, e.g. ["All"]')
        dry = _check(values) or dry
    return dry

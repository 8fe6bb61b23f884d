"""`POST …/pods/{name}/eviction` (what `kubectl drain` sends): evicting deletes the pod.

The store has no disruption budgets, so an eviction is always allowed: the pod is
deleted as a DELETE would delete it, and the answer is the API server's `Status` of an
accepted eviction (201, `Success`). The body is a `policy/v1` Eviction; its name, when
given, must be the pod's, and `deleteOptions.dryRun: ["All"]` deletes nothing (as
`?dryRun=All` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from .bodies import json_response, read_object
from .errors import StatusError, bad_request

__all__ = ["evict"]


async def evict(request: web.Request, name: str, delete: Callable[[], Any]) -> web.Response:
    if request.method != "POST":
        raise StatusError(
            405, f"{request.method} is not allowed on pods/eviction; POST an Eviction"
        )
    body = await read_object(request)
    if body.get("kind") not in (None, "Eviction"):
        raise bad_request(f"an eviction body is an Eviction, not a {body.get('kind')!r}")
    meta = body.get("metadata") or {}
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    given = meta.get("name")
    if given not in (None, "", name):
        raise bad_request(f"the Eviction names {given!r}, not the pod {name!r}")
    options = body.get("deleteOptions") or {}
    if not isinstance(options, dict):
        raise bad_request("deleteOptions must be an object")
    dry_run = options.get("dryRun")
    if dry_run not in (None, [], ["All"]):
        raise bad_request('deleteOptions.dryRun must be ["All"] or absent')
    if dry_run != ["All"]:
        delete()
    return json_response(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
        status=201,
    )

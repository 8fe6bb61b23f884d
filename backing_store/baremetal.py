"""Ironic-style bare metal: the `nodes/{name}/power` subresource and allocations.

Nodes are the core cluster-scoped `nodes` with `spec.owner` (a tenant) and
`spec.resource_class`; a node is free while `status.allocation` is unset.
Allocations (tenant-scoped, `baremetal/v1`) take `spec.resource_class` and optional
`spec.owner`: creating one picks the first free node of the class (of that owner when
one is set) and records it both ways; with no free node the allocation is stored in
state `error` with `status.last_error`. Deleting an allocation frees its node.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .bodies import json_response, read_object
from .errors import StatusError, bad_request, not_found
from .resources import NODES
from .storage import Store, range_end

POWER_TARGETS = {"power on": "power on", "power off": "power off", "reboot": "power on"}


def _power_body(name: str, node: dict[str, Any]) -> dict[str, Any]:
    status = node.get("status") if isinstance(node.get("status"), dict) else {}
    assert isinstance(status, dict)
    return {
        "kind": "NodePower",
        "apiVersion": "v1",
        "metadata": {"name": name},
        "power_state": status.get("power_state", "power off"),
    }


async def power(request: web.Request, store: Store, name: str) -> web.Response:
    """GET the power state; PUT `{"target": "power on"|"power off"|"reboot"}` (202)."""
    key = NODES.key(None, None, name)
    node = store.get(key)
    if node is None:
        raise not_found("nodes", name)
    if request.method in ("GET", "HEAD"):
        return json_response(_power_body(name, node))
    if request.method != "PUT":
        raise StatusError(405, f"{request.method} is not allowed on nodes/power")
    body = await read_object(request)
    meta = body.get("metadata")
    if isinstance(meta, dict):  # preconditions, as on every write (409 when stale)
        for field in ("resourceVersion", "uid"):
            want = meta.get(field)
            if want not in (None, "") and str(want) != node["metadata"].get(field):
                raise StatusError(
                    409,
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    "Conflict",
                )
    target = body.get("target")
    if not isinstance(target, str) or target not in POWER_TARGETS:
        raise bad_request(f"target must be one of {sorted(POWER_TARGETS)}")
    status = node.get("status")
    if not isinstance(status, dict):
        status = node["status"] = {}
    status["power_state"] = POWER_TARGETS[target]
    store.write(key, node, create=False)
    return json_response(_power_body(name, node), status=202)


def validate_allocation(obj: dict[str, Any]) -> tuple[str, str | None]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise bad_request("an allocation needs spec.resource_class")
    rclass = spec.get("resource_class")
    if not isinstance(rclass, str) or not rclass:
        raise bad_request("spec.resource_class must be a non-empty string")
    owner = spec.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise bad_request("spec.owner must be a string")
    return rclass, owner or None


def allocate(store: Store, tenant: str, obj: dict[str, Any]) -> None:
    """Pick a free node for a new allocation (inside the caller's transaction)."""
    rclass, owner = validate_allocation(obj)
    name = obj["metadata"]["name"]
    prefix = NODES.prefix()
    sql = (
        "SELECT key, data FROM objects WHERE key >= ? AND key < ?"
        " AND json_extract(data, '$.spec.resource_class') = ?"
        " AND json_extract(data, '$.status.allocation') IS NULL"
    )
    params: list[object] = [prefix, range_end(prefix), rclass]
    if owner is not None:
        sql += " AND owner = ?"
        params.append(owner)
    row = store.db.execute(sql + " ORDER BY key LIMIT 1", params).fetchone()
    if row is None:
        whose = f" owned by {owner!r}" if owner else ""
        obj["status"] = {
            "state": "error",
            "last_error": f"no free node of resource class {rclass!r}{whose}",
        }
        return
    node = json.loads(row[1])
    status = node.get("status")
    if not isinstance(status, dict):
        status = node["status"] = {}
    status["allocation"] = f"{tenant}/{name}"
    store.write(str(row[0]), node, create=False)
    obj["status"] = {"state": "active", "node": node["metadata"]["name"]}


def release(store: Store, tenant: str, obj: dict[str, Any]) -> None:
    """Free the node held by an allocation that is being deleted."""
    status = obj.get("status")
    node_name = status.get("node") if isinstance(status, dict) else None
    if not isinstance(node_name, str):
        return
    key = NODES.key(None, None, node_name)
    node = store.get(key)
    if node is None:
        return
    nstatus = node.get("status")
    holder = f"{tenant}/{obj['metadata']['name']}"
    if isinstance(nstatus, dict) and nstatus.get("allocation") == holder:
        del nstatus["allocation"]
        store.write(key, node, create=False)

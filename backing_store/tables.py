"""`Table` answers (DESIGN §10): what `kubectl get` shows.

kubectl's `get` (human-readable output) asks for
`Accept: application/json;as=Table;v=v1;g=meta.k8s.io, …;v=v1beta1…, application/json`
and prints the server's columns; an answer that is not a Table falls back to NAME and
AGE. A list, a single GET and a watch answer a `meta.k8s.io` Table (`v1` or `v1beta1`,
whichever the client named first) when asked: `{kind: Table, apiVersion, metadata,
columnDefinitions, rows: [{cells, object}]}`; a watch sends one Table of one row per
event. `includeObject` says what each row carries: `Metadata` (the default, a
`PartialObjectMetadata`), `Object` (the whole object, kubectl's `--sort-by`) or `None`;
any other value → 400.

The columns are one table, `COLUMNS`, by resource plural; every other resource shows
Name and Age. Ages are worded as Kubernetes words them (`45s`, `3m20s`, `5h`, `12d`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .errors import bad_request

Obj = Mapping[str, Any]
TABLE_GROUP = "meta.k8s.io"
TABLE_VERSIONS = ("v1", "v1beta1")
INCLUDE = ("Metadata", "Object", "None")
NONE = "<none>"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # an OpenAPI type: string, integer, …
    description: str
    cell: Callable[[Obj, float], Any]
    format: str = ""

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": 0,
        }


def _at(obj: Obj, dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _text(dotted: str, empty: str = NONE) -> Callable[[Obj, float], str]:
    def cell(obj: Obj, _now: float) -> str:
        value = _at(obj, dotted)
        return str(value) if isinstance(value, str | int | float) and value != "" else empty

    return cell


def _count(dotted: str) -> Callable[[Obj, float], int]:
    def cell(obj: Obj, _now: float) -> int:
        value = _at(obj, dotted)
        return value if type(value) is int else 0

    return cell


def _size(*paths: str) -> Callable[[Obj, float], int]:
    def cell(obj: Obj, _now: float) -> int:
        return sum(len(v) for p in paths if isinstance(v := _at(obj, p), dict))

    return cell


def _tags(obj: Obj, _now: float) -> str:
    tags = obj.get("tags")
    return (
        ",".join(t for t in tags if isinstance(t, str)) if isinstance(tags, list) and tags else NONE
    )


def _pod_ready(obj: Obj, _now: float) -> str:
    containers = _at(obj, "spec.containers")
    statuses = _at(obj, "status.containerStatuses")
    ready = (
        sum(1 for s in statuses if isinstance(s, dict) and s.get("ready") is True)
        if isinstance(statuses, list)
        else 0
    )
    return f"{ready}/{len(containers) if isinstance(containers, list) else 0}"


def _pod_status(obj: Obj, _now: float) -> str:
    reason, phase = _at(obj, "status.reason"), _at(obj, "status.phase")
    return reason if isinstance(reason, str) and reason else phase if isinstance(phase, str) else ""


def _deployment_ready(obj: Obj, _now: float) -> str:
    desired = _at(obj, "spec.replicas")
    desired = desired if type(desired) is int else 1  # Kubernetes' default
    return f"{_count('status.readyReplicas')(obj, _now)}/{desired}"


def _age(obj: Obj, now: float) -> str:
    stamp = _at(obj, "metadata.creationTimestamp")
    try:
        created = datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    return human_duration(now - created.timestamp())


def human_duration(seconds: float) -> str:
    """A duration as Kubernetes prints an age (apimachinery's duration.HumanDuration)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, hours // 24 % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


NAME = Column(
    "Name",
    "string",
    "Name must be unique within a namespace.",
    _text("metadata.name", ""),
    "name",
)
AGE = Column(
    "Age",
    "string",
    "CreationTimestamp is when the object was created, shown as its age.",
    _age,
)
# The one table of columns, by resource plural (Name first and Age last throughout).
COLUMNS: dict[str, tuple[Column, ...]] = {
    "servers": (
        NAME,
        Column("Tags", "string", "The server's tags.", _tags),
        Column("Status", "string", "The server's state (status.state).", _text("status.state")),
        AGE,
    ),
    "nodes": (
        NAME,
        Column(
            "Owner", "string", "The tenant that owns the node (spec.owner).", _text("spec.owner")
        ),
        Column(
            "Resource Class",
            "string",
            "The node's resource class (spec.resource_class).",
            _text("spec.resource_class"),
        ),
        AGE,
    ),
    "allocations": (
        NAME,
        Column("Node", "string", "The node allocated (status.node).", _text("status.node")),
        Column("State", "string", "The allocation's state (status.state).", _text("status.state")),
        AGE,
    ),
    "pods": (
        NAME,
        Column("Ready", "string", "Ready containers of all containers.", _pod_ready),
        Column("Status", "string", "The pod's reason or phase.", _pod_status),
        AGE,
    ),
    "deployments": (
        NAME,
        Column("Ready", "string", "Ready replicas of the desired replicas.", _deployment_ready),
        Column(
            "Up-to-date",
            "integer",
            "Replicas updated to the latest template.",
            _count("status.updatedReplicas"),
        ),
        Column(
            "Available",
            "integer",
            "Replicas available to serve.",
            _count("status.availableReplicas"),
        ),
        AGE,
    ),
    "configmaps": (
        NAME,
        Column("Data", "integer", "Keys in data and binaryData.", _size("data", "binaryData")),
        AGE,
    ),
    "secrets": (
        NAME,
        Column("Type", "string", "The secret's type.", _text("type")),
        Column("Data", "integer", "Keys in data.", _size("data")),
        AGE,
    ),
}
DEFAULT_COLUMNS = (NAME, AGE)
TENANT_COLUMN = Column(
    "Tenant", "string", "The tenant the object belongs to.", _text("metadata.tenant")
)


# -- content negotiation --------------------------------------------------------------


def table_version(request: web.Request) -> str | None:
    """The Table apiVersion the request's Accept asks for before plain JSON, or None."""
    for media_range in request.headers.get("Accept", "").split(","):
        kind, *params = (part.strip() for part in media_range.split(";"))
        if kind.lower() not in ("application/json", "application/*", "*/*"):
            continue
        options = dict(p.split("=", 1) for p in params if "=" in p)
        wanted = options.get("as")
        if wanted is None:
            return None  # plain JSON comes first
        if (
            wanted == "Table"
            and options.get("g") == TABLE_GROUP
            and options.get("v") in TABLE_VERSIONS
        ):
            return f"{TABLE_GROUP}/{options['v']}"
    return None


def include_object(request: web.Request) -> str:
    value = request.query.get("includeObject", "Metadata") or "Metadata"
    if value not in INCLUDE:
        raise bad_request(f"includeObject must be one of {', '.join(INCLUDE)}, not {value!r}")
    return value


# -- building tables ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableFormat:
    """What one request wants: the Table's apiVersion, the resource, row objects."""

    api_version: str
    plural: str
    include: str
    # A list or watch across every tenant (an operator's `kubectl get cm -A`): the rows
    # of two tenants may look alike, so a TENANT column comes first (DESIGN §3).
    across_tenants: bool = False

    @classmethod
    def of(
        cls, request: web.Request, plural: str, *, across_tenants: bool = False
    ) -> TableFormat | None:
        version = table_version(request)
        if version is None:
            return None
        return cls(version, plural, include_object(request), across_tenants)

    def table(self, items: Sequence[Obj], list_meta: Mapping[str, Any]) -> dict[str, Any]:
        columns: Sequence[Column] = COLUMNS.get(self.plural, DEFAULT_COLUMNS)
        if self.across_tenants:
            columns = (TENANT_COLUMN, *columns)
        now = datetime.now(UTC).timestamp()
        return {
            "kind": "Table",
            "apiVersion": self.api_version,
            "metadata": dict(list_meta),
            "columnDefinitions": [c.definition() for c in columns],
            "rows": [self._row(obj, columns, now) for obj in items],
        }

    def _row(self, obj: Obj, columns: Sequence[Column], now: float) -> dict[str, Any]:
        row: dict[str, Any] = {"cells": [c.cell(obj, now) for c in columns]}
        if self.include == "Object":
            row["object"] = obj
        elif self.include == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": f"{TABLE_GROUP}/v1",
                "metadata": obj.get("metadata") or {},
            }
        return row

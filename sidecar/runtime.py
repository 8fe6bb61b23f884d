"""Shared services handed to every stage factory: config, metrics, policy, upstream.

A stage module exposes `make_stage(rt: Runtime) -> Stage`. Stages that own resources
(a ledger connection, a Redis client, the audit writer) register coroutines in
`rt.on_startup` / `rt.on_cleanup`; `app.py` runs them with the aiohttp app. Readiness
checks go in `rt.ready_checks` (name → coroutine returning (ok, detail)).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sidecar.config import Config

if TYPE_CHECKING:
    from sidecar.metrics import Metrics
    from sidecar.policy.store import PolicyStore
    from sidecar.proxy import Upstream

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]


@dataclass
class Runtime:
    config: Config
    metrics: Metrics
    policy: PolicyStore
    upstream: Upstream
    on_startup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_cleanup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    ready_checks: dict[str, ReadyCheck] = field(default_factory=dict)
    # Objects a stage wants to share with another (e.g. the quota ledger for the API).
    extras: dict[str, Any] = field(default_factory=dict)

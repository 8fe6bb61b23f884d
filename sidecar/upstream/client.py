"""The upstream as the services and stages see it: its errors, a dry run's answer, and
the calls they make (`UpstreamClient`); `sidecar.edge.proxy.Upstream` implements them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError


class UpstreamError(StatusError):
    """A 502/503/504 caused by the upstream."""


class DryRunAnswer(NamedTuple):
    """The upstream's answer to a request sent as a `dryRun=All` (`Upstream.dry_run`):
    its status, Content-Type and body, and for a 2xx the object it would make (the
    parsed JSON body; None otherwise)."""

    status: int
    content_type: str
    body: bytes
    object: Any


class UpstreamClient(Protocol):
    """What services call on the upstream besides forwarding (`edge.proxy.Upstream`
    is the one implementation): a GET of a JSON document as an identity, and a GET of
    a list whose items are handed over one at a time as they are read."""

    async def get_json(
        self,
        path: str,
        identity: Identity | None = None,
        query: list[tuple[str, str]] | None = None,
        request_id: str = "",
    ) -> tuple[int, Any]: ...

    async def get_items(
        self,
        path: str,
        identity: Identity | None,
        query: list[tuple[str, str]],
        item: Callable[[Any], None],
    ) -> tuple[int, dict[str, Any]]: ...

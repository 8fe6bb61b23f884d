"""The pipeline: an ordered chain of stages around a terminal handler.

A stage is an async callable `(ctx, call_next) -> response`. It may answer itself
(raise `StatusError` or return a response without calling `call_next`), or call the
rest of the chain and act on what comes back (quota commit/release, audit). The order
of stages is decided in `app.py` only.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from aiohttp import web

from sidecar.pipeline.context import RequestContext

Handler = Callable[[RequestContext], Awaitable[web.StreamResponse]]


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> web.StreamResponse: ...


def build_chain(stages: Sequence[Stage], terminal: Handler) -> Handler:
    """Compose stages so that `stages[0]` runs first and `terminal` runs last.

    `partial` rather than a wrapper coroutine: every resume of the innermost await
    passes through each frame of the chain, so one frame per stage, not two."""
    handler = terminal
    for stage in reversed(stages):
        handler = functools.partial(stage.__call__, call_next=handler)
    return handler

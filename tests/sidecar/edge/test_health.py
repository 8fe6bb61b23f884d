"""`/readyz`'s checks (sidecar/edge/health.py), in process: they run concurrently, one
without an answer within the budget counts as failed (and is never started twice while
it runs), and from SIGTERM on the answer is 503."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sidecar.edge.health import Readiness
from sidecar.services.metrics import Metrics


async def answer(readiness: Readiness) -> tuple[int, dict[str, Any]]:
    readiness._result = None  # a fresh evaluation, not the reused one
    response = await readiness.response()
    assert isinstance(response.body, bytes)
    return response.status, json.loads(response.body)


async def test_a_stalled_check_fails_within_the_budget_and_is_not_started_again() -> None:
    readiness = Readiness(Metrics(), check_seconds=0.1)
    release = asyncio.Event()
    started = 0

    async def stalled() -> tuple[bool, str]:
        nonlocal started
        started += 1
        await release.wait()  # the behaviour under test: a dependency that never answers
        return True, "late"

    async def fine() -> tuple[bool, str]:
        return True, "fine"

    readiness.add("upstream", stalled, required=True)
    readiness.add("ledger", stalled)
    readiness.add("policy", fine, required=True)
    for _ in range(3):
        status, body = await answer(readiness)
        assert status == 503
        assert body["checks"]["upstream"] == {
            "ok": False,
            "required": True,
            "detail": "no answer within 0.1 s",
        }
        assert body["checks"]["policy"]["ok"] is True
        assert body["degraded"] == ["ledger", "upstream"]
    assert started == 2  # once per check, however often /readyz was asked
    release.set()  # the dependency answers again
    status, body = await answer(readiness)
    assert status == 200
    assert body["checks"]["upstream"]["detail"] == "late"
    # The stalled probes ended before this evaluation looked: fresh ones answered.
    assert started == 4


async def test_the_checks_run_concurrently() -> None:
    """Each of these two answers only once the other has started: run one after the
    other, the first would wait out its budget and fail."""
    readiness = Readiness(Metrics(), check_seconds=5)
    began = {"a": asyncio.Event(), "b": asyncio.Event()}

    def meeting(me: str, other: str) -> Any:
        async def probe() -> tuple[bool, str]:
            began[me].set()
            await began[other].wait()
            return True, f"{me} met {other}"

        return probe

    readiness.add("a", meeting("a", "b"))
    readiness.add("b", meeting("b", "a"))
    status, body = await answer(readiness)
    assert status == 200
    assert body["checks"]["a"]["detail"] == "a met b"
    assert body["checks"]["b"]["detail"] == "b met a"


async def test_a_check_that_raises_fails_without_failing_the_answer() -> None:
    readiness = Readiness(Metrics())

    async def broken() -> tuple[bool, str]:
        raise RuntimeError("secret detail /etc/path")

    readiness.add("ratelimit", broken)
    status, body = await answer(readiness)
    assert status == 200
    assert body["checks"]["ratelimit"]["detail"] == "the check failed (see the log)"


async def test_shutting_down_is_503_at_once() -> None:
    readiness = Readiness(Metrics())
    called = 0

    async def fine() -> tuple[bool, str]:
        nonlocal called
        called += 1
        return True, "fine"

    readiness.add("upstream", fine, required=True)
    assert (await answer(readiness))[0] == 200
    readiness.shutting_down()
    status, body = await answer(readiness)
    assert status == 503
    assert body["ready"] is False
    assert body["degraded"] == ["shutdown"]
    assert called == 1  # the checks are not run any more

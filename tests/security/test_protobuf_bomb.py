"""Protobuf expansion bombs (issue 22 item 8, DESIGN §10): a ~3 MiB protobuf ConfigMap of
1.57M empty entries (2 bytes each on the wire, at least 3 bytes each as JSON) held the
event loop for 2.9 s while it was converted (another tenant waited 2.6 s) and got its
413 only after the conversion. Now it is a 413 before any conversion, decided in the
sidecar's worker process, and another tenant's reads go on meanwhile. Real sidecar and
store processes (tests/rigs/stack.py)."""

from __future__ import annotations

import asyncio
import time

from sidecar.kube_protobuf import MEDIA_TYPE
from tests.rigs.protobuf import finalizer_bomb, map_bomb
from tests.rigs.stack import ALICE, BOB, CONFIGMAPS, Env

# A generous bound: the old code made the other tenant wait 2.6 s; now the slowest of its
# reads during the attack takes tens of milliseconds (docs/security.md has the figures).
OTHER_TENANT_WORST_SECONDS = 1.0


async def _reads_until(env: Env, attack: asyncio.Task[object]) -> list[float]:
    """Another tenant's reads, one after the other, until the attack is answered."""
    times: list[float] = []
    while not attack.done() or not times:
        started = time.monotonic()
        status, body = await env.call(BOB, "GET", CONFIGMAPS)
        assert status == 200, body
        times.append(time.monotonic() - started)
    return times


async def _attack(env: Env, bombs: list[bytes]) -> list[tuple[int, str]]:
    answers = []
    for bomb in bombs:
        status, body = await env.call(ALICE, "POST", CONFIGMAPS, bomb, MEDIA_TYPE)
        answers.append((status, body["message"]))
    return answers


async def test_bombs_are_413_before_conversion_and_others_are_not_held(stack: Env) -> None:
    bombs = [finalizer_bomb(), map_bomb(), finalizer_bomb()]
    assert all(2_000_000 < len(bomb) <= 3 * 1024 * 1024 for bomb in bombs)
    attack = asyncio.create_task(_attack(stack, bombs))
    times = await _reads_until(stack, attack)
    answers = await attack
    for status, message in answers:
        assert status == 413, message
        assert "more entries than" in message  # the bound's refusal, before conversion
    assert max(times) < OTHER_TENANT_WORST_SECONDS, times
    assert await stack.stored("acme", "namespaces/ns1/configmaps") == []
    assert await stack.used("acme", "configmaps") == ("0", "0")

"""FilterLane: owner-filtered lists take turns on the event loop (DESIGN §8, §11).

One piece at a time, a turn of the loop between two pieces even for a list alone,
tenants in turn (not lists), at most `share` of each window, and a waiter that is
cancelled never holds the lane. No timing asserts: a fake clock says how long a piece
took.
"""

from __future__ import annotations

import asyncio
import itertools

from sidecar.services.listfilter import FilterLane


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _pieces(lane: FilterLane, tenant: str, name: str, n: int, log: list[str]) -> None:
    for _ in range(n):
        async with lane.turn(tenant):
            log.append(name)


async def test_a_list_alone_lets_the_loop_turn_between_its_pieces() -> None:
    lane = FilterLane()
    log: list[str] = []
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            log.append("tick")
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await _pieces(lane, "acme", "piece", 5, log)
    done = True
    await tick_task
    pieces = [i for i, entry in enumerate(log) if entry == "piece"]
    # Between any two pieces, the other task ran at least once.
    for a, b in itertools.pairwise(pieces):
        assert "tick" in log[a + 1 : b], log


async def test_tenants_take_turns_not_lists() -> None:
    lane = FilterLane()
    log: list[str] = []
    # The lane is busy while every list queues: then the order is the lane's.
    async with lane.turn("holder"):
        tasks = [asyncio.create_task(_pieces(lane, "acme", f"acme{i}", 1, log)) for i in range(3)]
        tasks.append(asyncio.create_task(_pieces(lane, "quiet", "quiet0", 1, log)))
        for _ in range(3):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    # acme's three lists get one turn per round, as quiet's one list does.
    assert log == ["acme0", "quiet0", "acme1", "acme2"]


async def test_pieces_past_the_share_of_a_window_wait_for_the_next() -> None:
    clock = FakeClock()
    lane = FilterLane(share=0.5, window=0.01, clock=clock)
    for _ in range(4):
        async with lane.turn("acme"):
            clock.now += 0.004  # each piece takes 4 ms of a 10 ms window
    assert lane.rested >= 1
    # Pieces well under the share never rest.
    quick = FilterLane(share=0.5, window=0.01, clock=clock)
    for _ in range(20):
        async with quick.turn("acme"):
            clock.now += 0.0001
        clock.now += 0.001
    assert quick.rested == 0


async def test_a_cancelled_waiter_does_not_hold_the_lane() -> None:
    lane = FilterLane()
    log: list[str] = []
    async with lane.turn("holder"):
        gone = asyncio.create_task(_pieces(lane, "acme", "gone", 1, log))
        kept = asyncio.create_task(_pieces(lane, "beta", "kept", 1, log))
        await asyncio.sleep(0)
        gone.cancel()
    await asyncio.wait_for(kept, 5)
    assert log == ["kept"]
    assert gone.cancelled()


async def test_a_turn_handed_to_a_cancelled_task_is_passed_on() -> None:
    lane = FilterLane()
    log: list[str] = []
    async with lane.turn("holder"):
        first = asyncio.create_task(_pieces(lane, "acme", "first", 1, log))
        second = asyncio.create_task(_pieces(lane, "beta", "second", 1, log))
        await asyncio.sleep(0)
    # The lane is handed to `first` on the next turn of the loop; cancel it right then.
    loop = asyncio.get_running_loop()
    loop.call_soon(first.cancel)
    await asyncio.wait_for(second, 5)
    assert log[-1] == "second"
    assert "first" not in log or first.done()


async def test_a_piece_that_raises_hands_the_lane_on() -> None:
    lane = FilterLane()
    log: list[str] = []

    async def broken() -> None:
        async with lane.turn("acme"):
            raise ValueError("invalid list")

    async with lane.turn("holder"):
        bad = asyncio.create_task(broken())
        good = asyncio.create_task(_pieces(lane, "beta", "good", 2, log))
        await asyncio.sleep(0)
    results = await asyncio.gather(bad, good, return_exceptions=True)
    assert isinstance(results[0], ValueError)
    assert log == ["good", "good"]

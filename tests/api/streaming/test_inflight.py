"""The in-flight streams' frame flusher: bounded turns, the oldest stream first."""
from __future__ import annotations

import asyncio

import pytest

from inferd.api.streaming import inflight
from inferd.api.streaming.inflight import FLUSH_BUDGET_S, Flusher


class Clock:
    """The Flusher's clock, moved only by the frames it writes (a loaded machine's preemption never counts)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(inflight, "_perf", fake)
    return fake


class _Frame:
    """A Sender stand-in for the Flusher: each flush costs `cost_s` on the clock and notes its turn."""

    def __init__(self, i: int, flushed: list[int], clock: Clock, cost_s: float) -> None:
        self.i, self.flushed, self.clock, self.cost_s, self.pushed_at = i, flushed, clock, cost_s, None

    def flush(self) -> None:
        self.clock.now += self.cost_s
        self.flushed.append(self.i)


async def test_a_flush_turn_stops_at_its_budget_and_the_other_streams_follow_in_order(clock):
    flushed: list[int] = []
    flusher = Flusher()
    for i in range(100):
        flusher.mark(_Frame(i, flushed, clock, cost_s=0.0005))     # 50 ms of frames in all
    await asyncio.sleep(0)                                 # one loop turn: one flush turn
    # The budget (2 ms: 4 of these frames) is looked at every 16 frames: the first look ends the turn.
    assert FLUSH_BUDGET_S < 16 * 0.0005 and len(flushed) == 16, flushed
    for _ in range(100):
        if len(flushed) == 100:
            break
        await asyncio.sleep(0)
    assert flushed == list(range(100))                     # each once, the oldest first


async def test_a_flush_turn_with_time_to_spare_writes_every_stream(clock):
    flushed: list[int] = []
    flusher = Flusher()
    for i in range(200):
        flusher.mark(_Frame(i, flushed, clock, cost_s=0.0))
    await asyncio.sleep(0)
    assert flushed == list(range(200))


async def test_a_turn_whose_after_step_fails_leaves_the_flusher_taking_turns():
    """A bug in `after` (the writer pool's STEP sends) is the loop's to report; the streams marked later still get turns."""
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
    calls = []

    def after() -> None:
        calls.append(len(calls))
        raise RuntimeError("a bug")
    try:
        flusher = Flusher(after=after)
        for turn in (1, 2):
            flusher.wake()
            await asyncio.sleep(0)
            assert len(calls) == turn and len(reported) == turn
    finally:
        loop.set_exception_handler(None)

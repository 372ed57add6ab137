"""The in-flight streams' frame flusher: bounded turns, the oldest stream first."""
from __future__ import annotations

import asyncio
import time

from inferd.api.streaming.inflight import Flusher


class _Frame:
    """A Sender stand-in for the Flusher: each flush costs `cost_s` of CPU and notes its turn."""

    def __init__(self, i: int, flushed: list[int], cost_s: float) -> None:
        self.i, self.flushed, self.cost_s, self.pushed_at = i, flushed, cost_s, None

    def flush(self) -> None:
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        self.flushed.append(self.i)


async def test_a_flush_turn_stops_at_its_budget_and_the_other_streams_follow_in_order():
    flushed: list[int] = []
    flusher = Flusher()
    for i in range(100):
        flusher.mark(_Frame(i, flushed, cost_s=0.0005))     # 50 ms of frames in all
    await asyncio.sleep(0)                                 # one loop turn: one flush turn
    assert 0 < len(flushed) < 100, "a turn wrote every frame: the loop was held for all of them"
    for _ in range(100):
        if len(flushed) == 100:
            break
        await asyncio.sleep(0)
    assert flushed == list(range(100))                     # each once, the oldest first


async def test_a_flush_turn_with_time_to_spare_writes_every_stream():
    flushed: list[int] = []
    flusher = Flusher()
    for i in range(200):
        flusher.mark(_Frame(i, flushed, cost_s=0.0))
    await asyncio.sleep(0)
    assert flushed == list(range(200))

"""The Now view's history: a small in-memory ring of each engine's load, one sample every 10 s, 15 minutes kept.

Sampled by one task of the app (nothing else to run, and nothing kept on disk): per engine, batch fill, KV use,
requests queued and tokens/s. A sample costs a stats() call per engine; the ring holds 90 per engine.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

INTERVAL_S = 10.0
KEPT = 90                    # 15 minutes at INTERVAL_S
FIELDS = ("fill", "kv", "queued", "tokens_per_s")


class Samples:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.series: dict[str, deque[tuple[float, ...]]] = {}     # engine -> (t, fill, kv, queued, tokens/s)

    def sample(self, state) -> None:
        now = self._clock()
        for name, engine in list(state.engines.items()):
            try:
                stats, info = engine.stats(), engine.info
                queued, _ = state.tenancy.queue_for(name, engine).pressure()
            except Exception:  # a failing engine is left out of this sample, not the console
                continue
            fill = stats.running / info.max_batch_size if info.max_batch_size else 0.0
            kv = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
            self.series.setdefault(name, deque(maxlen=KEPT)).append((now, fill, kv, float(queued), stats.tokens_per_s))
        for name in set(self.series) - set(state.engines):      # unloaded: its history goes with it
            del self.series[name]

    def as_json(self) -> dict:
        """engine -> {"t": [...], field: [...]}: the arrays uPlot draws."""
        out = {}
        for name, ring in self.series.items():
            columns = list(zip(*ring)) if ring else [()] * (len(FIELDS) + 1)
            out[name] = {"t": list(columns[0]), **{f: list(c) for f, c in zip(FIELDS, columns[1:])}}
        return out

    async def run(self, state) -> None:
        while True:
            self.sample(state)
            await asyncio.sleep(INTERVAL_S)      # read each time: a test may shorten it

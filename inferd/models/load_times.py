"""How long model loads take, and so when a version waiting for its load should be ready.

A version's estimate is its last measured load; before the first, the sim's own load time (its profile's
weights at its load bandwidth, x time_scale) or the footprint at LOAD_BYTES_PER_S plus LOAD_SETUP_S. The
lifecycle answers a request that cannot wait with this estimate as its Retry-After.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from inferd.config import ModelConfig

LOAD_BYTES_PER_S = 1e9                   # a first load's estimate, before one was measured
LOAD_SETUP_S = 1.0


class LoadTimes:
    """Loads under way (since when) and the last measured load of each version."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.since: dict[Hashable, float] = {}          # loads under way -> when they started
        self._measured: dict[Hashable, float] = {}

    def started(self, key: Hashable) -> float:
        t0 = self.since[key] = self.clock()
        return t0

    def ended(self, key: Hashable, seconds: float | None) -> None:
        """`key`'s load is over (`seconds`: it succeeded and took that long)."""
        self.since.pop(key, None)
        if seconds is not None:
            self._measured[key] = seconds

    def estimate(self, key: Hashable, model: ModelConfig, footprint: int) -> float:
        measured = self._measured.get(key)
        if measured is not None:
            return measured
        sim = model.sim
        if model.backend == "sim" and sim is not None and sim.simulate_load:
            from inferd.engine.sim import get_profile

            return get_profile(sim.profile).load_time_s() * sim.time_scale + 0.1
        return LOAD_SETUP_S + footprint / LOAD_BYTES_PER_S

    def ready_in(self, key: Hashable, queue: Sequence[Hashable], estimate: Callable[[Hashable], float]) -> float:
        """Seconds until `key`'s load (under way, or queued in `queue` behind the ones before it) should
        be done: what is left of the loads under way, then every load queued ahead, then its own."""
        now = self.clock()
        ahead = queue[: queue.index(key)] if key in queue else []
        left = sum(max(0.0, estimate(k) - (now - t0)) for k, t0 in self.since.items() if k != key)
        left += sum(estimate(k) for k in ahead)
        if key in self.since:
            return left + max(0.1, estimate(key) - (now - self.since[key]))
        return left + estimate(key)

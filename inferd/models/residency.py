"""Which model versions are resident under a node's memory budget, and what to evict to load another.

The policy, on integers and a clock only (tested without engines, like the reference engine's
block manager). A version is `cold` (its artifact on disk), `loading`, `warming`, `hot` or `draining`.
Its footprint counts against the budget from the moment its load starts (so two loads cannot both
count on the same free bytes) until it is unloaded; a load measures the real footprint and corrects
the estimate.

To load a cold version that does not fit, the least recently used hot versions are evicted, but only
those that have been idle (resident and unused: no request started or ended on them) for at least
`min_residency_s`, have no request in flight, and are not pinned (`pinned` models, and versions in an
active rollout, never leave). That is the hysteresis: a version loaded or used within the last
`min_residency_s` stays, so two models alternating cannot evict each other on every request. It is
counted from the last use rather than from the load because bench/lifecycle.py measured both: counted
from the load, it protects a tail model loaded for one request and evicts an older popular one
instead, and lost to plain LRU on hit rate and goodput; counted from the last use, it beat plain LRU
on both. With `min_residency_s = 0` this is plain LRU. When nothing can go now, the refusal says how
long until something could (the soonest an eligible version will have been idle long enough, if no
request uses it meanwhile), so the caller answers 503 with a Retry-After, never a hang; a version
larger than the budget less what is pinned can never load, and says so.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

COLD, LOADING, WARMING, HOT, DRAINING = "cold", "loading", "warming", "hot", "draining"
# Slack on the minimum residency: a caller that waits exactly the Retry-After it was given must find the
# version idle long enough (if nobody used it meanwhile), whatever the float rounding of `now - last_used`.
AGE_SLACK_S = 1e-6
STATES = (COLD, LOADING, WARMING, HOT, DRAINING)


class NeverFits(Exception):
    """The version is larger than the budget less what is pinned: it can never be loaded here."""


@dataclass(slots=True)
class Resident:
    footprint: int                  # bytes: estimated until loaded, then measured
    pinned: bool = False
    state: str = COLD
    loaded_at: float = -math.inf    # when it became hot
    last_used: float = -math.inf
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class LoadPlan:
    evict: tuple[Hashable, ...] = ()        # to unload first, least recently used first


@dataclass(frozen=True, slots=True)
class NoRoom:
    retry_after_s: float                    # until an eligible version could be evicted (inf: unknown)
    reason: str                             # "in_flight" | "min_residency" (used too recently) | "loading"


@dataclass
class Residency:
    budget_bytes: int
    min_residency_s: float = 0.0
    clock: Callable[[], float] = time.monotonic
    versions: dict[Hashable, Resident] = field(default_factory=dict)

    def register(self, key: Hashable, footprint: int, *, pinned: bool = False) -> None:
        """A cold version (or an update of its estimate and pin)."""
        r = self.versions.get(key)
        if r is None:
            self.versions[key] = Resident(footprint, pinned)
        else:
            r.pinned = pinned
            if r.state == COLD:
                r.footprint = footprint

    # -- the budget ----------------------------------------------------------------------
    def used_bytes(self) -> int:
        """Bytes counted against the budget: every version not cold."""
        return sum(r.footprint for r in self.versions.values() if r.state != COLD)

    def state(self, key: Hashable) -> str:
        return self.versions[key].state

    def plan_load(self, key: Hashable) -> LoadPlan | NoRoom:
        """What loading cold `key` takes now: the versions to evict first, or why it cannot load yet.
        Raises NeverFits when it could not fit even with every unpinned version gone."""
        r = self.versions[key]
        pinned = sum(v.footprint for k, v in self.versions.items() if k != key and v.pinned and v.state != COLD)
        if r.footprint > self.budget_bytes - pinned:
            raise NeverFits(f"needs {r.footprint} bytes; the budget is {self.budget_bytes}, of which {pinned} "
                            f"are pinned")
        need = self.used_bytes() + r.footprint - self.budget_bytes
        if need <= 0:
            return LoadPlan()
        now = self.clock()
        victims, freed = [], 0
        for k, v in sorted(self.versions.items(), key=lambda kv: kv[1].last_used):
            if freed >= need:
                break
            if self._evictable(v, now):
                victims.append(k)
                freed += v.footprint
        if freed >= need:
            return LoadPlan(tuple(victims))
        return self._no_room(now)

    def _evictable(self, v: Resident, now: float) -> bool:
        return (v.state == HOT and not v.pinned and v.in_flight == 0
                and now - v.last_used + AGE_SLACK_S >= self.min_residency_s)

    def _no_room(self, now: float) -> NoRoom:
        """Why nothing can be evicted now, and the soonest something could be."""
        hot = [v for v in self.versions.values() if v.state == HOT and not v.pinned]
        young = [self.min_residency_s - (now - v.last_used) for v in hot
                 if v.in_flight == 0 and now - v.last_used + AGE_SLACK_S < self.min_residency_s]
        if young:
            return NoRoom(max(0.0, min(young)), "min_residency")
        if any(v.in_flight for v in hot) or any(v.state == DRAINING for v in self.versions.values()):
            return NoRoom(math.inf, "in_flight")
        return NoRoom(math.inf, "loading")     # the budget is held by loads under way

    # -- transitions -----------------------------------------------------------------------
    def loading(self, key: Hashable) -> None:
        self._move(key, (COLD,), LOADING)

    def warming(self, key: Hashable, measured_bytes: int | None = None) -> None:
        """Loaded (its real footprint measured, when known); warming up before it serves."""
        r = self._move(key, (LOADING,), WARMING)
        if measured_bytes is not None:
            r.footprint = measured_bytes

    def hot(self, key: Hashable) -> None:
        r = self._move(key, (LOADING, WARMING), HOT)
        r.loaded_at = r.last_used = self.clock()

    def failed(self, key: Hashable) -> None:
        """Its load failed: back to cold, its bytes free again."""
        self._move(key, (LOADING, WARMING), COLD)

    def evicting(self, key: Hashable) -> bool:
        """Start unloading `key`: True when it can go now (nothing in flight), else it drains first."""
        r = self._move(key, (HOT, DRAINING), DRAINING)
        return r.in_flight == 0

    def unloaded(self, key: Hashable) -> None:
        r = self._move(key, (DRAINING, HOT), COLD)
        r.loaded_at = -math.inf

    def _move(self, key: Hashable, allowed: tuple[str, ...], to: str) -> Resident:
        r = self.versions[key]
        if r.state not in allowed:
            raise ValueError(f"{key}: cannot go from {r.state} to {to}")
        r.state = to
        return r

    # -- use ------------------------------------------------------------------------------
    def acquire(self, key: Hashable) -> None:
        """A request started on `key` (hot): it cannot be evicted while any is in flight."""
        r = self.versions[key]
        r.in_flight += 1
        r.last_used = self.clock()

    def hold(self, key: Hashable, held: bool = True) -> None:
        """Keep `key` from eviction as a request would (`held=False`: let it go), without counting as a use."""
        self.versions[key].in_flight += 1 if held else -1

    def release(self, key: Hashable) -> bool:
        """A request on `key` ended. True when `key` is draining and now idle: unload it."""
        r = self.versions[key]
        r.in_flight -= 1
        r.last_used = self.clock()          # recency is when it was last busy, not when that began
        return r.state == DRAINING and r.in_flight == 0

"""How much a tenant has asked of this node lately: an exponentially decaying request rate.

Cluster-wide quotas (inferd.cluster.shares) split each tenant's limit between nodes in proportion to
this demand, so it counts attempts, refused ones included: a node whose share is too small to admit
anything must still show its demand to get a bigger share.
"""
from __future__ import annotations

import math

DEMAND_TAU_S = 5.0      # time constant: a change in traffic shows within a few seconds, bursts are smoothed


class DecayingRate:
    """Events per second, each weighted exp(-age / tau): `add` now, read `rate` later."""

    __slots__ = ("tau_s", "_value", "_at")

    def __init__(self, now: float, tau_s: float = DEMAND_TAU_S) -> None:
        self.tau_s = tau_s
        self._value = 0.0
        self._at = now

    def _decay(self, now: float) -> None:
        if now > self._at:
            self._value *= math.exp(-(now - self._at) / self.tau_s)
            self._at = now

    def add(self, n: float, now: float) -> None:
        self._decay(now)
        self._value += n

    def rate(self, now: float) -> float:
        self._decay(now)
        return self._value / self.tau_s

"""What each peer has spent per budgeted tenant, kept after the peer dies or leaves.

Budgets (inferd.tenancy.budget) are enforced on the cluster's sum: this node's own ledger rows plus
what every peer reports in its load reports (TenantDemand.spend, .tokens_today). Unlike load hints,
spend does not go stale: what a node spent stays spent when it crashes, drains or stops reporting
for a while, so its last report counts until the budget period it was made in is over. A node that
comes back (same node id) reports again from its own ledger and replaces it.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from inferd.cluster.messages import Load

_KEEP_S = 32 * 86_400             # older than any budget period (a month): forgotten
_PRUNE_EVERY_S = 3_600


class PeerSpends:
    """Loop thread only. Bounded by peers x budgeted tenants; reports older than a month are dropped."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall = wall_clock
        self._by_node: dict[str, dict[str, tuple[float, int, float]]] = {}  # node -> tenant -> (cost, tokens, at)
        self._pruned = wall_clock()

    def heard(self, node: str, load: Load) -> None:
        at = self._wall() - max(0.0, load.age_s)      # when the peer measured it (wall clock, for periods)
        spent = self._by_node.setdefault(node, {})
        for d in load.demand:
            if d.spend or d.tokens_today or d.tenant in spent:
                spent[d.tenant] = (d.spend, d.tokens_today, at)
        if at - self._pruned > _PRUNE_EVERY_S:
            self._prune(at)

    def spend(self, tenant: str, period_start: float, day_start: float) -> tuple[float, int]:
        """The peers' cost reported within the period starting at `period_start`, and their tokens
        reported since `day_start` (a report from before a period began speaks of the one before)."""
        cost, tokens = 0.0, 0
        for spent in self._by_node.values():
            found = spent.get(tenant)
            if found is None:
                continue
            c, t, at = found
            if at >= period_start:
                cost += c
            if at >= day_start:
                tokens += t
        return cost, tokens

    def _prune(self, now: float) -> None:
        self._pruned = now
        for node, spent in list(self._by_node.items()):
            for tenant, (_, _, at) in list(spent.items()):
                if now - at > _KEEP_S:
                    del spent[tenant]
            if not spent:
                del self._by_node[node]

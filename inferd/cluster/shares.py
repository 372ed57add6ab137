"""Cluster-wide tenant quotas without a central store: each node's share of a tenant's limits.

Every node enforces `share x limit` of each tenant's RPM and TPM (inferd.tenancy's Quota scales its
buckets), where its share is its recent demand from that tenant (requests attempted, refused ones
included: inferd.tenancy.demand) over the demand all live nodes report, each plus a small floor so a
node that starts seeing a tenant can admit something before its demand has been gossiped.

Every node reads the same figures: its own demand as it last reported it to its peers (`reported`),
not its live demand. The live figure already counts the request being decided, which at a few
requests per tau is a large part of it (one arrival adds 1/tau = 0.2 req/s): a node saw itself that
much busier than its peers saw it, and the cluster admitted up to twice the limit at low rates. From
the gossiped figures the shares of the live nodes sum to 1 (up to one report's delay), so the cluster
admits at most the configured limit; a node whose peers' reports are stale (or that has no peers)
enforces the whole limit, as a single node does.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from inferd.cluster.loads import PeerLoads
from inferd.cluster.messages import TenantDemand

FLOOR = 0.02          # requests/s of demand every live node is assumed to have, per tenant
REFRESH_S = 0.1       # shares are recomputed at most this often per tenant (the request path asks often)


class QuotaShares:
    """share(tenant) for Quota.set_share. Loop thread only."""

    def __init__(self, peers: PeerLoads, live_nodes: Callable[[], Iterable[str]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._peers = peers
        self._live_nodes = live_nodes
        self._clock = clock
        # This node's demand as its peers see it: what its last load report said. Before the first one
        # (at most load_interval_s after start), or when the last is stale for the peers too (no peer
        # was alive to send it to), the floor for every tenant.
        self._reported: dict[str, float] = {}
        self._reported_at = -float("inf")
        self._cache: dict[str, float] = {}
        self._cached_at = -float("inf")

    def reported(self, demand: Iterable[TenantDemand]) -> None:
        """This node's load report, as it is being sent: its own demand from now on."""
        self._reported = {d.tenant: d.requests_per_s for d in demand}
        self._reported_at = self._clock()
        self._cached_at = -float("inf")

    def __call__(self, tenant: str) -> float:
        now = self._clock()
        if now - self._cached_at > REFRESH_S:
            self._cache, self._cached_at = self._compute(now), now
        return self._cache.get(tenant, self._cache.get("", 1.0))

    def _compute(self, now: float) -> dict[str, float]:
        """tenant -> share; "" -> the share of a tenant nobody reported (an equal split)."""
        reports = [d for d in (self._peers.fresh_demand(n) for n in self._live_nodes()) if d is not None]
        mine = self._reported if now - self._reported_at <= self._peers.max_age_s else {}
        tenants = set(mine).union(*reports) if reports else set(mine)
        n = 1 + len(reports)
        shares = {"": 1.0 / n}
        for t in tenants:
            own = mine.get(t, 0.0) + FLOOR
            total = own + sum(r[t].requests_per_s + FLOOR if t in r else FLOOR for r in reports)
            shares[t] = own / total
        return shares

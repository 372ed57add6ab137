"""A cluster's shared quotas simulated offline: N nodes' Quota and QuotaShares on one fake clock.

Each node is the real inferd.tenancy Quota with the real inferd.cluster QuotaShares, wired as
inferd.cluster.Cluster wires them: every `load_interval_s` a node sends its load report (its tenants'
demand, as local_report builds it) to every peer's PeerLoads. Requests arrive as a Poisson stream from
a seeded RNG and go to the nodes round-robin or at random; each is prechecked and acquired as the API
does, and an admitted one is released having used all it was charged (a sim engine with ignore_eos).
Deterministic for a seed; a few hundred simulated seconds take well under a second.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from inferd.cluster.loads import PeerLoads
from inferd.cluster.messages import Load, TenantDemand
from inferd.cluster.shares import QuotaShares
from inferd.config import TenantConfig, TenantRegistry
from inferd.tenancy.quota import Quota, QuotaExceeded
from inferd.types import Usage

TENANT = "acme"
PROMPT_TOKENS = 6       # what the sim tokenizer makes of bench/cluster_daemons.py's prompt


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Outcome:
    limit: float                 # per minute: tokens (TPM) or requests (RPM)
    offered: float               # per minute, in the measured window
    admitted: float              # per minute, in the measured window
    refused: int = 0
    per_node: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.admitted / self.limit


class _Node:
    def __init__(self, name: str, tenants: TenantRegistry, clock: Clock, live: list[str]) -> None:
        self.name = name
        self.quota = Quota(tenants, clock=clock)
        self.loads = PeerLoads(max_age_s=3.0, clock=clock)
        self.shares = QuotaShares(self.loads, lambda: [n for n in live if n != name], clock)
        self.quota.set_share(self.shares)

    def report(self) -> Load:
        """What Cluster's load-report wrapper sends (and records as this node's own reported demand)."""
        demand = tuple(TenantDemand(t, rate, n) for t, rate, n in self.quota.demand())
        self.shares.reported(demand)
        self.quota.reshare()
        return Load(age_s=0.0, versions=(), demand=demand)

    def request(self, cost: int) -> bool:
        try:
            self.quota.precheck(TENANT)
            lease = self.quota.acquire(TENANT, prompt_tokens=PROMPT_TOKENS, max_tokens=cost - PROMPT_TOKENS)
        except QuotaExceeded:
            return False
        lease.release(Usage(prompt_tokens=PROMPT_TOKENS, completion_tokens=cost - PROMPT_TOKENS))
        return True


def simulate(nodes: int, rate_per_node: float, cost: int, *, kind: str = "tpm", overload: float = 3.0,
             warmup_s: float = 90.0, window_s: float = 300.0, spread: str = "round_robin",
             load_interval_s: float = 0.5, seed: int = 1) -> Outcome:
    """Admitted per minute vs the limit, for one tenant offered `overload` times its `kind` limit
    ("tpm" or "rpm") at `rate_per_node` requests/s per node, each costing `cost` tokens. Measured over
    `window_s` after `warmup_s` (every bucket starts full: the first minute's burst is not the steady state)."""
    offered_per_min = nodes * rate_per_node * 60 * (cost if kind == "tpm" else 1)
    limit = max(1, round(offered_per_min / overload))
    tenant = TenantConfig(tokens_per_minute=limit) if kind == "tpm" else TenantConfig(requests_per_minute=limit)
    clock = Clock()
    names = [f"n{i}" for i in range(nodes)]
    tenants = TenantRegistry({TENANT: tenant})
    cluster = {name: _Node(name, tenants, clock, names) for name in names}
    rng = random.Random(seed)
    start, end = clock.t, clock.t + warmup_s + window_s
    events: list[tuple[float, int, str, str]] = []      # (time, tiebreak, what, node)
    for i, name in enumerate(names):
        events.append((start + rng.uniform(0, load_interval_s), i, "report", name))
    total_rate = nodes * rate_per_node
    gap = (lambda: 1 / total_rate) if spread == "paced" else (lambda: rng.expovariate(total_rate))
    events.append((start + gap(), -1, "arrival", ""))
    heapq.heapify(events)
    admitted, sent, refused, turn = [0.0] * nodes, 0, 0, 0
    while events:
        t, tiebreak, what, name = heapq.heappop(events)
        if t > end:
            break
        clock.t = t
        if what == "report":
            load = cluster[name].report()
            for peer in names:
                if peer != name:
                    cluster[peer].loads.heard(name, load)
            heapq.heappush(events, (t + load_interval_s, tiebreak, "report", name))
            continue
        k = turn % nodes if spread != "random" else rng.randrange(nodes)
        turn += 1
        measured = t >= start + warmup_s
        ok = cluster[names[k]].request(cost)
        if measured:
            sent += 1
            refused += not ok
            admitted[k] += ok * (cost if kind == "tpm" else 1)
        heapq.heappush(events, (t + gap(), -1, "arrival", ""))
    per_min = 60 / window_s
    return Outcome(limit=limit, offered=sent * (cost if kind == "tpm" else 1) * per_min,
                   admitted=sum(admitted) * per_min, refused=refused, per_node=[a * per_min for a in admitted])

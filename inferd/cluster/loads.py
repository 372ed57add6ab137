"""Peers' load hints as this node last heard them, and this node's own report.

A node's report (inferd.cluster.messages.Load) may come in parts; each part replaces what the last
report said of the versions and tenants it carries, so a part that is lost only leaves those a little
older. A hint's age is its age when sent plus the time since it arrived (no clocks need to agree);
hints older than `load_max_age_s` are stale and ignored, as are those of members not alive.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from inferd.cluster.messages import Load, TenantDemand, VersionLoad
from inferd.engine import Engine
from inferd.tenancy import Tenancy, budgeted


class _Heard:
    __slots__ = ("versions", "demand", "at")

    def __init__(self) -> None:
        self.at = -float("inf")             # when its newest report was measured, on our clock
        self.versions: dict[tuple[str, str], tuple[VersionLoad, float]] = {}   # (model, version) -> (hint, sent at)
        self.demand: dict[str, tuple[TenantDemand, float]] = {}


class PeerLoads:
    """What every peer last reported. Loop thread only."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._peers: dict[str, _Heard] = {}

    def heard(self, node: str, load: Load) -> None:
        at = self._clock() - max(0.0, load.age_s)     # when it was measured, on our clock
        entry = self._peers.setdefault(node, _Heard())
        entry.at = max(entry.at, at)
        for v in load.versions:
            entry.versions[(v.model, v.version)] = (v, at)
        for d in load.demand:
            entry.demand[d.tenant] = (d, at)

    def forget(self, node: str) -> None:
        self._peers.pop(node, None)

    def versions(self, node: str) -> list[tuple[VersionLoad, float]]:
        """(hint, age in seconds) of each version `node` reported, fresh or not."""
        now = self._clock()
        entry = self._peers.get(node)
        return [] if entry is None else [(v, now - at) for v, at in entry.versions.values()]

    def report_age(self, node: str) -> float | None:
        """Seconds since `node`'s newest report was measured (None: never heard)."""
        entry = self._peers.get(node)
        return None if entry is None else self._clock() - entry.at

    def fresh_versions(self, node: str, model: str, version: str | None) -> list[VersionLoad]:
        """`node`'s fresh hints for `model`: at `version`, or (None) every version of it the node reported."""
        if version is not None:
            hint = self.fresh_version(node, model, version)
            return [] if hint is None else [hint]
        return [v for v, age in self.versions(node) if v.model == model and age <= self.max_age_s]

    def fresh_version(self, node: str, model: str, version: str) -> VersionLoad | None:
        entry = self._peers.get(node)
        found = entry.versions.get((model, version)) if entry is not None else None
        if found is None or self._clock() - found[1] > self.max_age_s:
            return None
        return found[0]

    def fresh_demand(self, node: str) -> dict[str, TenantDemand] | None:
        """The tenants' demand `node` reported, or None if its report is stale (or never came)."""
        entry = self._peers.get(node)
        now = self._clock()
        if entry is None or now - entry.at > self.max_age_s:
            return None
        return {t: d for t, (d, at) in entry.demand.items() if now - at <= self.max_age_s}


def local_report(tenancy: Tenancy, ready: Callable[[Engine], bool]) -> tuple[tuple[VersionLoad, ...],
                                                                           tuple[TenantDemand, ...]]:
    """This node's load hints: each engine version's room and queue, each tenant's recent demand."""
    versions = []
    for model, engine, queue in tenancy.queues():
        cap = engine.capacity()
        load = queue.load()
        versions.append(VersionLoad(model=model, version=engine.info.version, ready=ready(engine),
                                    free_slots=max(0, cap.free_slots), free_kv_blocks=max(0, cap.free_kv_blocks),
                                    queued=load.queued, est_wait_s=load.wait_s, tokens_per_s=load.cost_per_s))
    budgets = tenancy.budgets
    active = {t: (rate, n) for t, rate, n in tenancy.quota.demand()}
    spending = {t for t in budgets.tenants.names if budgeted(budgets.tenants.get(t))}
    demand = []
    for t in dict.fromkeys([*active, *spending]):
        rate, n = active.get(t, (0.0, 0))
        spend, tokens = budgets.own(t) if t in spending else (0.0, 0)
        demand.append(TenantDemand(tenant=t, requests_per_s=rate, in_flight=n, spend=spend, tokens_today=tokens))
    return tuple(versions), tuple(demand)

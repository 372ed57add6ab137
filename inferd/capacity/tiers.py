"""Precision tiers in a capacity plan: each share of the traffic on its own profile, with its own cost.

A demand file's `[tiers.<name>]` tables split `requests_per_s` between tiers, each planned on the profile
it runs at (say interactive on `llama3-70b-4xh100`, bf16, and batch on `llama3-70b-2xh100-fp8`), with its
own latency targets (a batch tier usually has none). With `--gpu-hour-cost`, each tier's cost per hour and
per 1k tokens (prompt and output) is printed: what the precision saves, next to what it needs.

    [tiers.interactive]
    share = 0.3                       # of requests_per_s
    profile = "llama3-70b-4xh100"
    ttft_p95_ms = 800                 # optional: this tier's targets, instead of [slo]'s
    itl_p99_ms = 40
    [tiers.batch]
    share = 0.7
    profile = "llama3-70b-2xh100-fp8"
    itl_p99_ms = 0                    # 0: no target for this tier
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferd.capacity.curves import ThroughputCurve
from inferd.capacity.demand import Demand
from inferd.capacity.errors import DemandError
from inferd.capacity.planner import Plan, plan_capacity

_TIER_KEYS = {"share", "profile", "ttft_p95_ms", "itl_p99_ms"}


@dataclass(frozen=True)
class Tier:
    name: str
    share: float
    profile: str
    demand: Demand           # the whole demand's lengths at this tier's rate and targets


@dataclass(frozen=True)
class TierPlan:
    tier: Tier
    plan: Plan
    gpu_hour_cost: float | None

    @property
    def cost_per_hour(self) -> float | None:
        """The colocated GPUs (how inferd's engines run prefill and decode) at the GPU-hour price."""
        return None if self.gpu_hour_cost is None else self.plan.colocated_gpus * self.gpu_hour_cost

    @property
    def cost_per_1k_tokens(self) -> float | None:
        d = self.tier.demand
        tokens_per_hour = d.requests_per_s * (d.prompt.mean + d.output.mean) * 3600
        cost = self.cost_per_hour
        return None if cost is None else cost / tokens_per_hour * 1000


def read_tiers(raw: dict[str, Any], demand: Demand) -> list[Tier]:
    """The `[tiers.*]` tables of a demand file (none: []); their shares must add up to 1."""
    tables = raw.get("tiers")
    if tables is None:
        return []
    if not isinstance(tables, dict) or not tables:
        raise DemandError("tiers must be a table of [tiers.<name>] tables")
    tiers = [_tier(name, table, demand) for name, table in tables.items()]
    total = sum(t.share for t in tiers)
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise DemandError(f"the tiers' shares add up to {total:g}, not 1")
    return tiers


def _tier(name: str, table: Any, demand: Demand) -> Tier:
    where = f"tiers.{name}"
    if not isinstance(table, dict):
        raise DemandError(f"{where} must be a table")
    unknown = sorted(set(table) - _TIER_KEYS)
    if unknown:
        raise DemandError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(_TIER_KEYS))})")
    share, profile = table.get("share"), table.get("profile")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise DemandError(f"{where}.share must be a number in (0, 1], got {share!r}")
    if not isinstance(profile, str) or not profile:
        raise DemandError(f"{where}.profile must name a profile (a sim profile, or one of --curves)")
    targets = {}
    for key in ("ttft_p95_ms", "itl_p99_ms"):
        value = table.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise DemandError(f"{where}.{key} must be a number of ms >= 0 (0: no target), got {value!r}")
        targets[key] = float(value) or None
    tier_demand = dataclasses.replace(demand, requests_per_s=demand.requests_per_s * share, **targets)
    return Tier(name=name, share=float(share), profile=profile, demand=tier_demand)


def plan_tiers(tiers: list[Tier], curve_for: Callable[[str, Demand], ThroughputCurve],
               gpu_hour_cost: float | None) -> list[TierPlan]:
    """Each tier planned on its profile's curve (SloUnreachable and CapacityError propagate, naming it)."""
    return [TierPlan(t, plan_capacity(curve_for(t.profile, t.demand), t.demand), gpu_hour_cost) for t in tiers]


def format_tiers(plans: list[TierPlan]) -> str:
    rows = [["tier", "profile", "share", "req/s", "TTFT p95", "ITL p99", "replicas", "GPUs", "util",
             "cost/hour", "cost/1k tokens"]]
    for p in plans:
        d = p.tier.demand
        cost, per_1k = p.cost_per_hour, p.cost_per_1k_tokens
        rows.append([p.tier.name, p.tier.profile, f"{p.tier.share:.0%}", f"{d.requests_per_s:g}",
                     f"{d.ttft_p95_ms:g} ms" if d.ttft_p95_ms else "-", f"{d.itl_p99_ms:g} ms" if d.itl_p99_ms else "-",
                     str(p.plan.colocated_replicas), str(p.plan.colocated_gpus),
                     f"{p.plan.colocated_utilisation:.0%}", "-" if cost is None else f"{cost:,.2f}",
                     "-" if per_1k is None else f"{per_1k:.6f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["per tier (colocated prefill and decode, as inferd's engines run them):"]
    lines += ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
              for r in rows]
    total = sum(p.plan.colocated_gpus for p in plans)
    lines.append(f"total: {total} GPUs" + (f", {sum(p.cost_per_hour for p in plans):,.2f} per hour"
                                           if plans and plans[0].gpu_hour_cost is not None else ""))
    return "\n".join(lines) + "\n"

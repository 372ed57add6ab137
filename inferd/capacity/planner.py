"""Replicas and GPUs one profile needs for a demand: prefill and decode sized separately, the binding one
wins, then the count that still has enough after losing a zone.

    prefill load = rate x mean prompt / prefill tokens/s        (replicas' worth of prefill, 100% busy)
    decode load  = rate x mean output / (batch / step(batch))   (batch: the largest within the ITL target)
    replicas     = ceil(max(prefill load, decode load) / target utilisation)

The two loads are compared, not added: each side sized on a replica's whole time,
which holds when one side dominates. Replicas that run both on the same GPUs (in-flight batching,
as every inferd engine does) time-share them, so the plan also carries
    colocated    = ceil((prefill load + decode load) / target utilisation)
which is what the sim engine itself shows when both loads matter (docs/capacity.md, "Which count").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from inferd.capacity.curves import ThroughputCurve
from inferd.capacity.demand import Demand
from inferd.capacity.errors import SloUnreachable

_EPSILON = 1e-9     # so 2.0000000001 replicas' worth of float noise is not rounded up to 3


@dataclass(frozen=True)
class Plan:
    curve: ThroughputCurve
    decode_batch: int                   # the batch each replica decodes at
    decode_step_s: float                # its step time (the ITL a token sees)
    prefill_load: float                 # replicas' worth of prefill work at 100% busy
    decode_load: float
    prefill_replicas: int               # ceil(load / target utilisation), at least 1
    decode_replicas: int
    replicas: int                       # the larger of the two
    binding: str                        # "prefill" or "decode": whichever needs more
    zone_split: tuple[int, ...] | None  # replicas per zone that survive losing one; None with one zone
    colocated_replicas: int             # ceil((prefill + decode load) / utilisation): both sides share a GPU
    colocated_zone_split: tuple[int, ...] | None

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_batch / self.decode_step_s

    @property
    def gpus(self) -> int:
        return self.replicas * self.curve.gpus_per_replica

    @property
    def prefill_utilisation(self) -> float:
        return self.prefill_load / self.replicas

    @property
    def decode_utilisation(self) -> float:
        return self.decode_load / self.replicas

    @property
    def headroom(self) -> float:
        """Share of the binding side's capacity left idle at `replicas`."""
        return 1.0 - max(self.prefill_utilisation, self.decode_utilisation)

    @property
    def colocated_gpus(self) -> int:
        return self.colocated_replicas * self.curve.gpus_per_replica

    @property
    def colocated_utilisation(self) -> float:
        return (self.prefill_load + self.decode_load) / self.colocated_replicas

    @property
    def zone_replicas(self) -> int | None:
        return None if self.zone_split is None else sum(self.zone_split)

    @property
    def zone_gpus(self) -> int | None:
        return None if self.zone_split is None else sum(self.zone_split) * self.curve.gpus_per_replica


def plan_capacity(curve: ThroughputCurve, demand: Demand) -> Plan:
    """The plan for one profile; raises SloUnreachable when no replica count meets the SLOs."""
    if demand.ttft_p95_ms is not None and curve.prefill_p95_s * 1e3 > demand.ttft_p95_ms:
        raise SloUnreachable(curve.name, f"no replica count meets ttft_p95_ms={demand.ttft_p95_ms:g}: prefill "
                                         f"of one p95 prompt ({demand.prompt.p95:g} tokens) alone takes "
                                         f"{curve.prefill_p95_s * 1e3:.0f} ms")
    batch = curve.decode_batch_within(None if demand.itl_p99_ms is None else demand.itl_p99_ms / 1e3)
    step = curve.step_s(batch)
    prefill_load = demand.requests_per_s * demand.prompt.mean / curve.prefill_tokens_per_s
    decode_load = demand.requests_per_s * demand.output.mean / (batch / step)
    prefill_replicas = replicas_for(prefill_load, demand.target_utilisation)
    decode_replicas = replicas_for(decode_load, demand.target_utilisation)
    replicas = max(prefill_replicas, decode_replicas)
    colocated = replicas_for(prefill_load + decode_load, demand.target_utilisation)
    return Plan(curve=curve, decode_batch=batch, decode_step_s=step, prefill_load=prefill_load,
                decode_load=decode_load, prefill_replicas=prefill_replicas, decode_replicas=decode_replicas,
                replicas=replicas, binding="prefill" if prefill_load > decode_load else "decode",
                zone_split=survive_zone_loss(replicas, demand.zones),
                colocated_replicas=colocated,
                colocated_zone_split=survive_zone_loss(colocated, demand.zones))


def replicas_for(load: float, target_utilisation: float) -> int:
    """Replicas that carry `load` (replicas' worth at 100%) at no more than the target utilisation."""
    return max(1, math.ceil(load / target_utilisation - _EPSILON))


def survive_zone_loss(needed: int, zones: int) -> tuple[int, ...] | None:
    """Replicas per zone, largest first, such that losing any one zone leaves at least `needed`.

    N replicas spread as evenly as possible (zones differ by at most one) lose at most ceil(N / Z) with
    a zone, so N - ceil(N / Z) = floor(N (Z-1) / Z) >= needed, whose smallest solution is
    N = ceil(needed * Z / (Z-1)). Rounding N up to a multiple of Z instead would waste up to Z-1 replicas
    and could make a fourth zone cost more than three. One zone cannot survive its own loss: None."""
    if zones < 1:
        raise ValueError(f"zones must be >= 1, got {zones}")
    if zones == 1:
        return None
    total = -(-needed * zones // (zones - 1))
    per_zone, extra = divmod(total, zones)
    return (per_zone + 1,) * extra + (per_zone,) * (zones - extra)

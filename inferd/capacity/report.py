"""The planner's output: a plain-text table for people, a JSON document for scripts."""
from __future__ import annotations

from typing import Any

from inferd.capacity.demand import Demand
from inferd.capacity.errors import SloUnreachable
from inferd.capacity.planner import Plan


def describe_demand(demand: Demand) -> str:
    slo = [f"TTFT p95 {demand.ttft_p95_ms:g} ms" if demand.ttft_p95_ms is not None else "no TTFT target",
           f"ITL p99 {demand.itl_p99_ms:g} ms" if demand.itl_p99_ms is not None else "no ITL target"]
    return (f"demand: {demand.requests_per_s:g} req/s; prompt mean {demand.prompt.mean:g} / p95 "
            f"{demand.prompt.p95:g} tokens; output mean {demand.output.mean:g} / p95 {demand.output.p95:g} "
            f"tokens; {'; '.join(slo)}; target utilisation {demand.target_utilisation:.0%}; "
            f"{demand.zones} zone{'s' if demand.zones != 1 else ''}")


def format_report(demand: Demand, plans: list[Plan], infeasible: list[SloUnreachable]) -> str:
    """Two tables (what one replica does at this demand; what the demand needs) and the infeasible profiles."""
    per_replica = [["profile", "source", "GPUs/replica", "prefill tok/s", "p95 prefill", "decode batch",
                    "batch limit", "step", "decode tok/s"]]
    for p in plans:
        limit = p.curve.max_batch_reason if p.decode_batch == p.curve.max_batch else "ITL"
        per_replica.append([p.curve.name, p.curve.source, str(p.curve.gpus_per_replica),
                            f"{p.curve.prefill_tokens_per_s:,.0f}", f"{p.curve.prefill_p95_s * 1e3:.0f} ms",
                            str(p.decode_batch), limit, f"{p.decode_step_s * 1e3:.1f} ms",
                            f"{p.decode_tokens_per_s:,.0f}"])
    zone_title = f"survives losing 1 of {demand.zones} zones"
    needs = [["profile", "prefill", "decode", "binds", "replicas", "GPUs", "util prefill/decode", "headroom",
              zone_title]]
    colocated = [["profile", "replicas", "GPUs", "util", "headroom", zone_title]]
    for p in plans:
        gpus = p.curve.gpus_per_replica
        needs.append([p.curve.name, str(p.prefill_replicas), str(p.decode_replicas), p.binding, str(p.replicas),
                      str(p.gpus), f"{p.prefill_utilisation:.0%} / {p.decode_utilisation:.0%}",
                      f"{p.headroom:.0%}", _zones(p.zone_split, gpus)])
        colocated.append([p.curve.name, str(p.colocated_replicas), str(p.colocated_gpus),
                          f"{p.colocated_utilisation:.0%}", f"{1 - p.colocated_utilisation:.0%}",
                          _zones(p.colocated_zone_split, gpus)])
    out = [describe_demand(demand), ""]
    if plans:
        out += ["per replica, at this demand:", *_table(per_replica), "",
                "needed, the binding side wins (replicas; GPUs = replicas x GPUs/replica):", *_table(needs), "",
                "needed if prefill and decode time-share the same GPUs (colocated: the sum of both loads):",
                *_table(colocated)]
    if infeasible:
        out += ["", "not feasible at any replica count:", *(f"  {e}" for e in infeasible)]
    return "\n".join(out) + "\n"


def report_json(demand: Demand, plans: list[Plan], infeasible: list[SloUnreachable]) -> dict[str, Any]:
    return {
        "demand": {
            "requests_per_s": demand.requests_per_s,
            "prompt": {"mean": demand.prompt.mean, "p95": demand.prompt.p95},
            "output": {"mean": demand.output.mean, "p95": demand.output.p95},
            "slo": {"ttft_p95_ms": demand.ttft_p95_ms, "itl_p99_ms": demand.itl_p99_ms},
            "target_utilisation": demand.target_utilisation, "zones": demand.zones,
        },
        "plans": [{
            "profile": p.curve.name, "source": p.curve.source, "gpus_per_replica": p.curve.gpus_per_replica,
            "prefill_tokens_per_s": p.curve.prefill_tokens_per_s, "prefill_p95_s": p.curve.prefill_p95_s,
            "max_batch": p.curve.max_batch, "max_batch_reason": p.curve.max_batch_reason,
            "decode_batch": p.decode_batch, "decode_step_s": p.decode_step_s,
            "decode_tokens_per_s": p.decode_tokens_per_s,
            "prefill_load": p.prefill_load, "decode_load": p.decode_load,
            "prefill_replicas": p.prefill_replicas, "decode_replicas": p.decode_replicas,
            "binding": p.binding, "replicas": p.replicas, "gpus": p.gpus,
            "prefill_utilisation": p.prefill_utilisation, "decode_utilisation": p.decode_utilisation,
            "headroom": p.headroom, "zone_split": list(p.zone_split) if p.zone_split else None,
            "zone_replicas": p.zone_replicas, "zone_gpus": p.zone_gpus,
            "colocated_replicas": p.colocated_replicas, "colocated_gpus": p.colocated_gpus,
            "colocated_utilisation": p.colocated_utilisation,
            "colocated_zone_split": list(p.colocated_zone_split) if p.colocated_zone_split else None,
        } for p in plans],
        "infeasible": [{"profile": e.profile, "reason": e.reason} for e in infeasible],
    }


def _zones(split: tuple[int, ...] | None, gpus_per_replica: int) -> str:
    if split is None:
        return "n/a (one zone)"
    return f"{sum(split)} = {'+'.join(map(str, split))} -> {sum(split) * gpus_per_replica} GPUs"


def _table(rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell: the first left-aligned (names), the rest right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            .rstrip() for row in rows]

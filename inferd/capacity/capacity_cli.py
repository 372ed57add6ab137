"""`inferd capacity`: the argparse subcommand and its entry point (exit 0, or 2 with a message)."""
from __future__ import annotations

import argparse
import json
import sys

from inferd.capacity.errors import CapacityError, SloUnreachable

DESCRIPTION = """\
GPUs needed per profile for a demand: prefill and decode replicas sized separately (the binding one
wins), the utilisation and headroom at that count, and the count that survives losing one of Z zones.

Per replica of each profile (one profile instance: tensor_parallel GPUs):
  prefill tok/s   prompt tokens/s with the token budget full (--max-num-tokens chunks) at the MEAN prompt
  p95 prefill     one P95 prompt prefilled alone; it must fit --ttft-p95-ms, else the profile is infeasible
  decode batch    the largest batch whose step at the mean context (mean prompt + mean output / 2) fits
                  --itl-p99-ms and whose KV fits (every slot sized for a P95 prompt + P95 output)
Then
  prefill load = rate x mean prompt / prefill tok/s;  decode load = rate x mean output / decode tok/s
  replicas     = ceil(max(prefill load, decode load) / target utilisation);  GPUs = replicas x GPUs/replica
  zones        = ceil(replicas x Z / (Z-1)) replicas, spread so zones differ by at most one: losing the
                 largest zone still leaves >= replicas
  colocated    = ceil((prefill load + decode load) / target utilisation): prefill and decode time-sharing
                 the same GPUs (in-flight batching, as inferd's engines run) need the
                 sum of the two loads, not the larger; printed as a third table
Means drive throughput; p95s size what one request needs (TTFT, KV).

Curves: the sim profiles' roofline by default (docs/sim.md), or measured figures from --curves FILE.
Demand: --demand FILE (TOML, or JSON if it ends in .json) and/or the flags below (a flag wins):
  requests_per_s = 50            target_utilisation = 0.8         zones = 3
  [prompt] mean = 1500, p95 = 4000     (or buckets = [[length, weight], ...])
  [output] mean = 300                  (p95 defaults to the mean)
  [slo] ttft_p95_ms = 1000, itl_p99_ms = 50
Exit 0 with the plan; 2 on a bad input, or when no profile can meet the SLOs (each says why).
Formulas, the curves schema and a worked example: docs/capacity.md."""


def add_capacity_parser(sub) -> None:
    """Add the `capacity` subcommand to an argparse subparsers object (argparse only: nothing is computed)."""
    p = sub.add_parser("capacity", help="GPUs needed for a demand (prefill vs decode, headroom, zone loss)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("throughput curves")
    src.add_argument("--profile", action="append", metavar="NAME",
                     help="plan for this profile (repeatable); default: every sim profile but the test toy "
                          "'tiny', or every profile of --curves")
    src.add_argument("--curves", metavar="FILE",
                     help="measured curves (JSON, schema in docs/capacity.md) instead of the sim roofline")
    src.add_argument("--block-size", type=int, metavar="N", default=16,
                     help="sim only: KV block size in tokens (default 16)")
    src.add_argument("--max-num-tokens", type=int, metavar="N", default=8192,
                     help="sim only: token budget per step, the prefill chunk (default 8192)")
    src.add_argument("--max-batch-size", type=int, metavar="N", default=256,
                     help="sim only: sequence slots per replica (default 256)")
    dem = p.add_argument_group("demand (flags override --demand FILE)")
    dem.add_argument("--demand", metavar="FILE", help="TOML (or .json) demand file, keys as above")
    dem.add_argument("--rate", type=float, metavar="REQ_PER_S", help="requests per second (requests_per_s)")
    dem.add_argument("--prompt-mean", type=float, metavar="TOKENS", help="mean prompt length: throughput")
    dem.add_argument("--prompt-p95", type=float, metavar="TOKENS",
                     help="p95 prompt length: TTFT and KV sizing (default: the mean)")
    dem.add_argument("--output-mean", type=float, metavar="TOKENS", help="mean output length: throughput")
    dem.add_argument("--output-p95", type=float, metavar="TOKENS",
                     help="p95 output length: KV sizing (default: the mean)")
    dem.add_argument("--ttft-p95-ms", type=float, metavar="MS", help="TTFT target (default: none)")
    dem.add_argument("--itl-p99-ms", type=float, metavar="MS",
                     help="inter-token latency target, caps the decode batch (default: none)")
    dem.add_argument("--target-utilisation", type=float, metavar="FRACTION",
                     help="plan replicas this busy at most, the rest is queueing headroom (default 0.8)")
    dem.add_argument("--zones", type=int, metavar="Z", help="failure zones the replicas spread over (default 1)")
    dem.add_argument("--gpu-hour-cost", type=float, metavar="COST",
                     help="with [tiers.*] in --demand: one GPU-hour's price, for each tier's cost per 1k tokens")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")


def capacity_main(args: argparse.Namespace) -> int:
    from inferd.capacity.demand import build_demand, read_demand_file, with_overrides
    from inferd.capacity.planner import plan_capacity
    from inferd.capacity.report import format_report, report_json
    try:
        raw = read_demand_file(args.demand) if args.demand else {}
        demand = build_demand(with_overrides(raw, {
            "requests_per_s": args.rate, "prompt.mean": args.prompt_mean, "prompt.p95": args.prompt_p95,
            "output.mean": args.output_mean, "output.p95": args.output_p95, "slo.ttft_p95_ms": args.ttft_p95_ms,
            "slo.itl_p99_ms": args.itl_p99_ms, "target_utilisation": args.target_utilisation,
            "zones": args.zones}))
        if raw.get("tiers") is not None:
            return _tiers_main(args, raw, demand)
        curves, infeasible = _curves(args, demand)
        plans = []
        for curve in curves:
            try:
                plans.append(plan_capacity(curve, demand))
            except SloUnreachable as exc:
                infeasible.append(exc)
    except CapacityError as exc:
        print(f"inferd capacity: {exc}", file=sys.stderr)
        return 2
    if not plans:
        for exc in infeasible:
            print(f"inferd capacity: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report_json(demand, plans, infeasible), indent=2))
    else:
        sys.stdout.write(format_report(demand, plans, infeasible))
    return 0


def _tiers_main(args: argparse.Namespace, raw: dict, demand) -> int:
    """Each [tiers.*] table planned on its own profile (and priced with --gpu-hour-cost)."""
    from inferd.capacity.tiers import format_tiers, plan_tiers, read_tiers

    if args.gpu_hour_cost is not None and not args.gpu_hour_cost > 0:
        raise CapacityError(f"--gpu-hour-cost must be > 0, got {args.gpu_hour_cost}")

    def curve_for(profile: str, tier_demand):
        curves, infeasible = _curves(argparse.Namespace(**{**vars(args), "profile": [profile]}), tier_demand)
        if infeasible:
            raise infeasible[0]
        return curves[0]

    plans = plan_tiers(read_tiers(raw, demand), curve_for, args.gpu_hour_cost)
    if args.json:
        print(json.dumps({"tiers": [{"tier": p.tier.name, "profile": p.tier.profile, "share": p.tier.share,
                                     "requests_per_s": p.tier.demand.requests_per_s,
                                     "replicas": p.plan.colocated_replicas, "gpus": p.plan.colocated_gpus,
                                     "cost_per_hour": p.cost_per_hour, "cost_per_1k_tokens": p.cost_per_1k_tokens}
                                    for p in plans]}, indent=2))
    else:
        from inferd.capacity.report import describe_demand
        sys.stdout.write(describe_demand(demand) + "\n\n" + format_tiers(plans))
    return 0


def _curves(args: argparse.Namespace, demand):
    """The curves asked for, and the profiles that cannot hold even one p95 sequence."""
    if args.curves:
        from inferd.capacity.curves import load_curves
        curves = load_curves(args.curves, demand)
        if not args.profile:
            return curves, []
        by_name = {c.name: c for c in curves}
        missing = [n for n in args.profile if n not in by_name]
        if missing:
            raise CapacityError(f"profile(s) {', '.join(missing)} not in {args.curves}; "
                                f"it has: {', '.join(by_name)}")
        return [by_name[n] for n in dict.fromkeys(args.profile)], []
    from inferd.capacity.sim_curves import sim_curve, sim_profile_names
    curves, infeasible = [], []
    for name in dict.fromkeys(args.profile or sim_profile_names()):
        try:
            curves.append(sim_curve(name, demand, block_size=args.block_size, max_num_tokens=args.max_num_tokens,
                                    max_batch_size=args.max_batch_size))
        except SloUnreachable as exc:
            infeasible.append(exc)
    return curves, infeasible

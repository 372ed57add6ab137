"""The capacity planner: GPUs a demand needs per profile, from sim-roofline or measured throughput curves.

`add_capacity_parser` / `capacity_main` are the `inferd capacity` CLI; the rest is the planner for code
that plans without the CLI. Importing this package does not import the engine (the sim curves do, lazily).
"""
from __future__ import annotations

from inferd.capacity.capacity_cli import add_capacity_parser, capacity_main
from inferd.capacity.curves import ThroughputCurve, load_curves
from inferd.capacity.demand import Demand, LengthDistribution, build_demand
from inferd.capacity.errors import CapacityError, CurvesError, DemandError, SloUnreachable
from inferd.capacity.planner import Plan, plan_capacity, survive_zone_loss
from inferd.capacity.sim_curves import sim_curve, sim_profile_names

__all__ = [
    "CapacityError", "CurvesError", "Demand", "DemandError", "LengthDistribution", "Plan", "SloUnreachable",
    "ThroughputCurve", "add_capacity_parser", "build_demand", "capacity_main", "load_curves", "plan_capacity",
    "sim_curve", "sim_profile_names", "survive_zone_loss",
]

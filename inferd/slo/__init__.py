"""Service level objectives: in-process burn rates, and monitoring as code.

`SloTracker` counts finished requests against the `[slos.*]` of the config (inferd.slo.events says
which requests count); `inferd monitoring rules|dashboard` writes Prometheus rules and a Grafana
dashboard for them (inferd.slo.rules, inferd.slo.dashboard). docs/slos.md is the operator's guide.
"""
from __future__ import annotations

from inferd.slo.burn import WINDOWS, BucketRing, BurnCounter
from inferd.slo.events import RequestOutcome, judge
from inferd.slo.monitoring_cli import add_monitoring_parser, monitoring_main
from inferd.slo.rules import ALERT_WINDOWS
from inferd.slo.tracker import SloTracker

__all__ = ["ALERT_WINDOWS", "WINDOWS", "BucketRing", "BurnCounter", "RequestOutcome", "SloTracker",
           "add_monitoring_parser", "judge", "monitoring_main"]

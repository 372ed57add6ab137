"""`inferd monitoring rules|dashboard --config FILE`: monitoring as code, printed to stdout."""
from __future__ import annotations

import argparse
import json
import sys


def add_monitoring_parser(sub: argparse._SubParsersAction) -> None:
    monitoring = sub.add_parser("monitoring", help="Prometheus rules and a Grafana dashboard for the config's SLOs")
    monitoring_sub = monitoring.add_subparsers(dest="monitoring_command", required=True)
    rules = monitoring_sub.add_parser("rules", help="print Prometheus recording and multi-window burn-rate alerting "
                                                    "rules for every [slos.*] (YAML)")
    dashboard = monitoring_sub.add_parser("dashboard", help="print a Grafana dashboard (JSON): SLO burn rates, "
                                                            "latency by stage, engines, refusals, tenants")
    for p in (rules, dashboard):
        p.add_argument("--config", default="config.toml", help="the daemon's config file (default: ./config.toml)")


def monitoring_main(args: argparse.Namespace) -> int:
    from inferd.config import ConfigError, load_config
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"inferd monitoring: cannot read {args.config}: {exc}", file=sys.stderr)
        return 1
    if args.monitoring_command == "rules":
        from inferd.slo.rules import render_rules
        sys.stdout.write(render_rules(config.slos))
    else:
        from inferd.slo.dashboard import dashboard
        sys.stdout.write(json.dumps(dashboard(config.slos), indent=2) + "\n")
    return 0

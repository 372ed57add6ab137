"""Small factories shared by the capacity tests."""
from __future__ import annotations

import argparse

from inferd.capacity import Demand, ThroughputCurve, add_capacity_parser, build_demand


def demand(**overrides) -> Demand:
    """A modest default demand (10 req/s, 500-token prompts and outputs, no SLOs), with overrides."""
    raw = {"requests_per_s": 10, "prompt": {"mean": 500}, "output": {"mean": 500}}
    raw.update(overrides)
    return build_demand(raw)


def curve(**overrides) -> ThroughputCurve:
    """A hand-made measured curve: 1 GPU, 10k prefill tok/s, steps of 10 ms at batch 1 to 20 ms at 100."""
    fields = dict(name="measured", source="test", gpus_per_replica=1, prefill_tokens_per_s=10_000.0,
                  prefill_p95_s=0.05, decode=((1, 0.010), (100, 0.020)), max_batch=100, max_batch_reason="max_batch")
    fields.update(overrides)
    return ThroughputCurve(**fields)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferd")
    add_capacity_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["capacity", *argv])

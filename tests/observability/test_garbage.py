"""inferd.observability.garbage: the collector's pauses, per generation, in the daemon's exposition; and its
thresholds for serving, set in a process of its own (they are the whole process's)."""
from __future__ import annotations

import gc
import json
import re
import subprocess
import sys

from prometheus_client.exposition import generate_latest

from inferd.api.streaming.writers import child_env
from inferd.observability import Metrics


def full_collections(metrics: Metrics) -> tuple[float, float]:
    text = generate_latest(metrics.registry).decode()
    count = re.search(r'^inferd_gc_pause_seconds_count\{generation="2"\} (\S+)$', text, re.M)
    total = re.search(r'^inferd_gc_pause_seconds_sum\{generation="2"\} (\S+)$', text, re.M)
    return float(count.group(1)), float(total.group(1))


def test_each_full_collection_is_counted_with_its_pause():
    metrics = Metrics()
    count, total = full_collections(metrics)
    gc.collect()
    gc.collect()
    after_count, after_total = full_collections(metrics)
    assert after_count >= count + 2 and after_total > total     # (an automatic one may come between)


def test_building_metrics_twice_times_each_collection_once():
    first, second = Metrics(), Metrics()
    count = full_collections(first)[0]
    gc.collect()
    after = full_collections(first)[0]
    assert after == full_collections(second)[0] and count + 1 <= after < count + 3   # once each, not per Metrics

PROBE = """
import gc, json
from inferd.observability.garbage import GEN0_THRESHOLD, tune_collector
before = gc.get_threshold()
print(json.dumps({"before": before, "returned": tune_collector(), "after": gc.get_threshold(),
                  "gen0": GEN0_THRESHOLD, "frozen": gc.get_freeze_count()}))
"""


def test_tuning_raises_only_the_youngest_generations_threshold_and_freezes_nothing():
    out = json.loads(subprocess.run([sys.executable, "-c", PROBE], env=child_env(), capture_output=True,
                                    text=True, check=True, timeout=60).stdout)
    assert out["returned"] == out["after"] == [out["gen0"], *out["before"][1:]]
    assert out["gen0"] > out["before"][0]
    assert out["frozen"] == 0       # engines retired while serving must stay collectable

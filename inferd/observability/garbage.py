"""Python's cyclic garbage collector in a serving process: its pauses, and how often it runs.

A collection stops every thread of the process (it holds the GIL), the event loop included, so a long one is
latency every stream feels at once. inferd_gc_pause_seconds times the pauses with a gc callback
(process-wide, installed once, whoever builds Metrics first) into plain bucket counts; GcCollector reads
them at scrape time.

tune_collector: the collector runs less often. At CPython's default it ran about 50 times a second in a
daemon serving thousands of streams (bench/node.py, 8 x 256): often enough that an engine step's objects
(alive for one step) lived through two young collections and were promoted to the oldest generation, and that
promotion is what makes CPython run a full collection. Those came every 2 to 3 seconds, each holding the loop
100 to 300 ms: everything tracked is traversed, the modules, config and tokenizers as well as the requests'
own objects. With the youngest generation collected every GEN0_THRESHOLD new objects instead of 700, a step's
objects die before it is: the collector's share of that bench's window fell from 11-13% to 2.5-2.8%, and its
longest pause from under 500 ms to under 100 ms (docs/performance.md, "The garbage collector").
The startup heap is not frozen (`gc.freeze()`, which vLLM calls after its warm-up): it made no difference
measured here, and this daemon retires engines while serving, whose frozen objects, in reference cycles,
would never be freed (a retired engine's weights among them).
"""
from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric

GEN0_THRESHOLD = 5000
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_BOUNDS = (*GC_PAUSE_BUCKETS, float("inf"))
_GENERATIONS = 3
# Per generation: the count in each bucket (and +Inf), and the sum of the pauses.
_counts = [[0] * len(_BOUNDS) for _ in range(_GENERATIONS)]
_sums = [0.0] * _GENERATIONS
_started = [0.0]


def _on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    generation = info.get("generation", 0)
    if 0 <= generation < _GENERATIONS:
        pause = time.perf_counter() - _started[0]
        _counts[generation][bisect.bisect_left(_BOUNDS, pause)] += 1
        _sums[generation] += pause


def watch_collections() -> None:
    """Time this process's collections from now on (once per process)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


class GcCollector:
    """inferd_gc_pause_seconds{generation}, from the counts the gc callback keeps."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "inferd_gc_pause_seconds", "Pauses of the cyclic garbage collector (every thread, the event loop "
            "included, waits them out), by generation (2: full collections)", labels=("generation",))
        for generation in range(_GENERATIONS):
            counts, running = _counts[generation], 0
            buckets = []
            for bound, count in zip(_BOUNDS, counts):
                running += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            family.add_metric((str(generation),), buckets, _sums[generation])
        yield family


def tune_collector() -> tuple[int, int, int]:
    """Collect the youngest generation every GEN0_THRESHOLD new objects; returns the thresholds now."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
    return gc.get_threshold()

"""Model lifecycle series under a memory budget (residency, loads, evictions), read from
inferd.models.ModelLifecycle at scrape time."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

STATES = ("cold", "loading", "warming", "hot", "draining")


def _histogram(name: str, doc: str, h: Any) -> HistogramMetricFamily:
    buckets = [(str(b), n) for b, n in zip(h.buckets, h.counts)] + [("+Inf", h.count)]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.sum)


class LifecycleCollector:
    """`source()` returns the live ModelLifecycle, or None without a memory budget (then: no series)."""

    def __init__(self, source: Callable[[], Any]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        lifecycle = self._source()
        if lifecycle is None:
            return
        snap = lifecycle.snapshot()
        # `version` is the configured one ("latest" or an id), so a series does not change name on each load
        residency = GaugeMetricFamily("inferd_model_residency", "1 for the state each configured version is in",
                                      labels=("model", "version", "state"))
        held = GaugeMetricFamily("inferd_model_memory_bytes", "Bytes a version holds against the budget "
                                 "(estimated until loaded, then measured); 0 when cold", labels=("model", "version"))
        for row in snap["versions"].values():
            for s in STATES:
                residency.add_metric((row["model"], row["configured"], s), 1.0 if row["state"] == s else 0.0)
            held.add_metric((row["model"], row["configured"]), row["bytes"] if row["state"] != "cold" else 0)
        budget = GaugeMetricFamily("inferd_model_memory_budget_bytes", "server.model_memory_bytes")
        budget.add_metric((), snap["budget_bytes"])
        used = GaugeMetricFamily("inferd_model_memory_used_bytes", "Bytes held by versions not cold")
        used.add_metric((), snap["used_bytes"])
        loads = CounterMetricFamily("inferd_model_loads", "Loads by result (success, failed)", labels=("result",))
        for result, n in lifecycle.loads.items():
            loads.add_metric((result,), n)
        evictions = CounterMetricFamily("inferd_model_evictions", "Versions unloaded, by reason (lru: to make "
                                        "room for a load; admin: POST /admin/models/.../unload; config: a reload "
                                        "dropped it while it loaded)", labels=("reason",))
        for reason, n in lifecycle.evictions.items():
            evictions.add_metric((reason,), n)
        yield from (residency, held, budget, used, loads, evictions)
        yield _histogram("inferd_model_load_seconds", "How long each load took (verify, start, warm)",
                         lifecycle.load_seconds)
        yield _histogram("inferd_model_cold_start_wait_seconds", "How long requests for a model that was not "
                         "loaded waited for it (those that got it)", lifecycle.cold_waits)

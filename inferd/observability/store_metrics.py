"""The durable store's series (inferd.store), built at scrape time from its counters.

Registered by inferd.observability.metrics.Metrics; `source()` returns the open Database or None (no
series). Spend is counted as rows commit (Metrics.count_spend); this reads the writer's state.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric


class StoreCollector:
    def __init__(self, source: Callable[[], Any]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        db = self._source()
        if db is None:
            return
        stats = db.stats()
        yield GaugeMetricFamily("inferd_store_pending_writes", "Writes queued for the store's next commit (the "
                                "ledger's queue depth; at store.max_pending_writes writers wait)",
                                value=stats.pending_writes)
        yield CounterMetricFamily("inferd_store_rows_written", "Rows the store committed (ledger rows among them)",
                                  value=stats.rows_written)
        yield CounterMetricFamily("inferd_store_errors", "Store writes or commits that failed", value=stats.errors)
        buckets = [(repr(float(b)), stats.commit_buckets.get(b, 0)) for b in sorted(stats.commit_buckets)]
        buckets.append(("+Inf", stats.commits))
        yield HistogramMetricFamily("inferd_store_commit_seconds", "Time of one group commit",
                                    buckets=buckets, sum_value=stats.commit_seconds_sum)

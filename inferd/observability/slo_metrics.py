"""SLO series, read from the SLO tracker at scrape time: nothing to update per request.

`inferd_slo_events_total{slo, result}` is what Prometheus rules compute burn rates from across a
fleet (inferd.slo.rules); the gauges are this process's own view, over what it has seen since it
started (inferd.slo.burn).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class SloSnapshot(msgspec.Struct, frozen=True):
    """One SLO's state at a scrape."""

    name: str
    model: str
    sli: str
    objective: float
    good: int                       # events since the process started
    bad: int
    burn_rates: dict[str, float]    # by window label (inferd.slo.burn.WINDOWS)
    budget_remaining: float


class SloCollector:
    def __init__(self, source: Callable[[], Sequence[SloSnapshot]]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []   # dynamic: the SLOs come and go with reloads

    def collect(self) -> Iterator[Metric]:
        labels = ("slo", "model", "sli")
        events = CounterMetricFamily("inferd_slo_events", "Requests an SLO judged, good or bad (its SLI's events)",
                                     labels=(*labels, "result"))
        burn = GaugeMetricFamily("inferd_slo_burn_rate", "Error-budget burn rate over a window: bad fraction / "
                                 "(1 - objective); this process since its start", labels=(*labels, "window"))
        budget = GaugeMetricFamily("inferd_slo_error_budget_remaining", "Share of the SLO window's error budget "
                                   "left (1 = untouched, < 0 = overspent); this process since its start",
                                   labels=labels)
        objective = GaugeMetricFamily("inferd_slo_objective", "The SLO's objective (fraction of good events)",
                                      labels=labels)
        for s in self._source():
            key = (s.name, s.model, s.sli)
            events.add_metric((*key, "good"), s.good)
            events.add_metric((*key, "bad"), s.bad)
            for window, rate in s.burn_rates.items():
                burn.add_metric((*key, window), rate)
            budget.add_metric(key, s.budget_remaining)
            objective.add_metric(key, s.objective)
        yield from (events, burn, budget, objective)

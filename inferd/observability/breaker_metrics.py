"""Circuit breaker series, read from the control plane's breakers at scrape time."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

STATES = ("closed", "open", "half_open")


class BreakerCollector:
    """`source()` returns inferd.models.BreakerState rows (model, version, state, transitions)."""

    def __init__(self, source: Callable[[], Sequence[Any]]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily("inferd_circuit_breaker_state", "1 for the state a version's breaker is in",
                                  labels=("model", "version", "state"))
        moves = CounterMetricFamily("inferd_circuit_breaker_transitions", "Times a version's breaker entered a "
                                    "state", labels=("model", "version", "state"))
        for row in self._source():
            for s in STATES:
                state.add_metric((row.model, row.version, s), 1.0 if row.state == s else 0.0)
                moves.add_metric((row.model, row.version, s), row.transitions.get(s, 0))
        yield from (state, moves)

"""The node's SLOs: finished requests in, burn rates and budgets out (inferd_slo_* at scrape time).

Loop thread only. `record` costs one dict lookup per request plus, per SLO about that model, a
judgement and three bucket increments. A config reload keeps the counts of every SLO whose
definition did not change (a renamed or redefined SLO starts afresh: its old events judged
something else).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from inferd.config import PriorityClass, SloConfig
from inferd.observability import SloSnapshot
from inferd.slo.burn import BurnCounter
from inferd.slo.events import RequestOutcome, judge, matches


class _Slo:
    __slots__ = ("name", "config", "counter")

    def __init__(self, name: str, config: SloConfig) -> None:
        self.name = name
        self.config = config
        self.counter = BurnCounter(config.error_budget, config.window_days)


class SloTracker:
    def __init__(self, slos: Mapping[str, SloConfig], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._slos: dict[str, _Slo] = {}
        self._by_model: dict[str, list[_Slo]] = {}
        self._ttft: dict[str, list[tuple[PriorityClass | None, float]]] = {}
        self.reconfigure(slos)

    def reconfigure(self, slos: Mapping[str, SloConfig]) -> None:
        kept = {}
        for name, config in slos.items():
            old = self._slos.get(name)
            kept[name] = old if old is not None and old.config == config else _Slo(name, config)
        self._slos = kept
        by_model: dict[str, list[_Slo]] = {}
        for slo in kept.values():
            by_model.setdefault(slo.config.model, []).append(slo)
        self._by_model = by_model
        ttft: dict[str, list[tuple[PriorityClass | None, float]]] = {}
        for slo in kept.values():
            if slo.config.sli == "ttft" and slo.config.threshold_ms is not None:
                ttft.setdefault(slo.config.model, []).append((slo.config.priority, slo.config.threshold_ms / 1000.0))
        self._ttft = ttft

    def __bool__(self) -> bool:
        return bool(self._slos)

    def ttft_budget_s(self, requested: str, model: str, priority: PriorityClass | None) -> float | None:
        """The tightest `ttft` threshold (seconds) of the SLOs that would judge a request that asked for
        `requested` (a served model or an alias), routed to `model`, in class `priority`; None: none does.
        Spillover's budget (inferd.api.pipeline.spill_decision): two dict lookups."""
        found = self._ttft.get(requested, ())
        if model != requested:
            found = [*found, *self._ttft.get(model, ())]
        budgets = [s for p, s in found if p is None or p is priority]
        return min(budgets) if budgets else None

    def record(self, outcome: RequestOutcome) -> None:
        """A request ended: count it in every SLO it is an event of."""
        candidates = self._by_model.get(outcome.requested or "", [])
        if outcome.model != outcome.requested:
            candidates = candidates + self._by_model.get(outcome.model or "", [])
        if not candidates:
            return
        now = self._clock()
        for slo in candidates:
            if matches(slo.config, outcome):
                good = judge(slo.config, outcome)
                if good is not None:
                    slo.counter.add(now, good)

    def snapshot(self) -> list[SloSnapshot]:
        now = self._clock()
        out = []
        for slo in self._slos.values():
            c, cfg = slo.counter, slo.config
            out.append(SloSnapshot(name=slo.name, model=cfg.model, sli=cfg.sli, objective=cfg.objective,
                                   good=c.good_total, bad=c.bad_total, burn_rates=c.burn_rates(now),
                                   budget_remaining=c.budget_remaining(now)))
        return out

"""Admission's estimates: a request's expected cost, the measured service rate, how long a queued
request would wait, and the Retry-After of a refusal.

Cost is in VTC units: prompt * prompt_cost_weight + output * output_cost_weight, with the output
expected from what recent requests produced (never above max_tokens). The service rate is served cost
per second of the queue's clock, measured over windows of at least 0.25 s. Only a window in which work
waited on engine capacity (saturated) measures capacity; an idle one only shows a lower bound, which
can raise an estimate but never makes one. Until a saturated window is measured, the engine's own
tokens/s stands in for Retry-After and the load peers see, but refuses nothing early: it is the rate the
engine ran at, not its capacity (an engine that ran light, or only its first cold steps, shows a small
fraction of what it serves full: an H200 decodes about 85x more tokens/s at batch 256 than at batch 1).
Without either, Retry-After is 1 s.
"""
from __future__ import annotations

from collections.abc import Callable

from inferd.admission.backlog import Backlog
from inferd.admission.ticket import UNKNOWN_RETRY_S, Ticket
from inferd.config import AdmissionConfig, TenantRegistry
from inferd.engine import Engine
from inferd.types import GenerationRequest

MIN_RETRY_S = 0.05
TYPICAL_OUTPUT = 16         # tokens: a request's output before any has been measured
_WINDOW_S = 0.25


class Estimator:
    """Estimates for one engine's queue. Loop-thread only."""

    def __init__(self, engine: Engine, clock: Callable[[], float]) -> None:
        self._engine = engine
        self._clock = clock
        self.mean_output: float | None = None      # completion tokens of recent requests (EMA)
        self.measured_rate: float | None = None    # served cost per second (EMA over windows)
        self._win_start = clock()
        self._win_cost = 0.0
        self._win_saturated = False

    # -- what requests cost --------------------------------------------------------------
    def cost(self, r: GenerationRequest, policy: AdmissionConfig) -> float:
        out = r.sampling.max_tokens if self.mean_output is None else min(r.sampling.max_tokens, self.mean_output)
        return len(r.prompt_token_ids) * policy.prompt_cost_weight + out * policy.output_cost_weight

    def typical_cost(self, policy: AdmissionConfig) -> float:
        """One request's cost as recent ones went (output only: prompts are unknown here)."""
        return (self.mean_output if self.mean_output is not None else TYPICAL_OUTPUT) * policy.output_cost_weight

    def observe_output(self, completion_tokens: int) -> None:
        """A request finished normally with this many tokens (a cancelled one would bias this down)."""
        m = self.mean_output
        self.mean_output = completion_tokens if m is None else m + 0.1 * (completion_tokens - m)

    # -- how fast cost is served ---------------------------------------------------------
    def saturated(self) -> None:
        """Work is waiting on engine capacity: this window measures capacity."""
        self._win_saturated = True

    def served(self, cost: float) -> None:
        now = self._clock()
        self._win_cost += cost
        span = now - self._win_start
        if span >= _WINDOW_S:
            rate = self._win_cost / span
            if self._win_saturated:
                ema = self.measured_rate
                self.measured_rate = rate if ema is None else ema + 0.3 * (rate - ema)
            elif self.measured_rate is not None:
                self.measured_rate = max(self.measured_rate, rate)
            # Else nothing is measured yet and this window is only a lower bound: it may be mostly idle
            # time (the first one runs from the queue's creation to its first request), and taking it
            # for capacity made a node that idled before its first burst refuse most of that burst.
            self._win_start, self._win_cost, self._win_saturated = now, 0.0, False

    def rate(self) -> float | None:
        """Served cost per second: measured, else the engine's tokens/s, else None."""
        if self.measured_rate:
            return self.measured_rate
        tps = self._engine.stats().tokens_per_s
        return tps if tps > 0 else None

    # -- waits and Retry-After -----------------------------------------------------------
    def wait(self, t: Ticket, backlog: Backlog, tenants: TenantRegistry, policy: AdmissionConfig, *,
             own_only: bool = False) -> tuple[float, float]:
        """(seconds until `t` would start, the part of it spent behind its own tenant's earlier requests):
        the queued cost served before it / the rate. Higher classes go first; in its class each other
        tenant v is served up to w_v/w_t of `t`'s own backlog (VTC), or everything older (FCFS)."""
        rate = self.rate()
        queues, queued_cost = backlog.fifos, backlog.cost
        mine = queues.get(t.tenant)
        if not mine or mine[-1].seq < t.seq:     # a newcomer: all of its tenant's queue is ahead of it (O(1))
            own = queued_cost.get(t.tenant, 0.0) if mine else 0.0
        else:
            own = sum(x.est_cost for x in mine if x.seq < t.seq)
        work = 0.0
        if not own_only:
            w_t = tenants.get(t.tenant).weight
            for n, q in queues.items():
                if not q or n == t.tenant:
                    continue
                if policy.scheduling == "fcfs":
                    work += sum(x.est_cost for x in q if x.seq < t.seq)
                elif q[0].cls.rank < t.cls.rank:
                    work += queued_cost[n]
                elif q[0].cls is t.cls:
                    work += min(queued_cost[n], (own + t.est_cost) * tenants.get(n).weight / w_t)
        if rate is None:
            return 0.0, 0.0
        return (own + work) / rate, own / rate

    def queued_wait(self, cost: float) -> float:
        """Seconds to serve `cost` of queued work at the measured rate (0 when none is measured)."""
        rate = self.rate()
        return cost / rate if rate else 0.0

    def retry_after(self, drain_s: float, fraction: float) -> float:
        """Retry-After: the time for enough of the queue to drain (`fraction` of `drain_s`; 0 = all of
        it) that the refused request would fit."""
        if not self.rate():
            return UNKNOWN_RETRY_S
        return max(MIN_RETRY_S, drain_s * min(1.0, max(fraction, 0.0)) if fraction else drain_s)

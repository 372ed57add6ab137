"""When a unary engine's pending requests become a batch: the batch-closing rules, as pure functions.

A batch closes when it reaches the size cap (requests or tokens), when its oldest request has waited
Wmax, or when waiting longer would make a request in it miss its deadline. Wmax is derived, not set:
the latency target (the route's SLO) minus the estimated compute time of the batch as it stands minus
a margin, clamped to a configured floor and ceiling; it shrinks as the batch grows, so the oldest
request's expected latency (wait + compute) stays within the target. Two more rules make it
deadline-aware rather than a timer:

- a request that cannot finish by its deadline even if started now, alone, is dropped before it costs
  compute (its answer would come too late to be of use), and a batch takes requests only while its
  estimated compute still lets every member meet its deadline;
- an idle engine does not wait for company that is not coming: when the measured arrival rate says
  no other request is expected before the batch would close anyway, it launches now.

The fixed-window and no-batching policies exist as baselines (bench/unary_batching.py compares all
three). Nothing here touches asyncio or an engine, so every rule is tested with plain numbers.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Estimate = Callable[[int, int], float]      # (requests, tokens) -> seconds of compute


@dataclass(slots=True)
class Pending:
    """A request waiting in a unary engine for its batch."""

    request_id: str
    tokens: int
    arrived: float                  # time.monotonic() when the engine got it
    deadline: float | None          # time.monotonic() by which its answer is due (None: none)


@dataclass(frozen=True, slots=True)
class Limits:
    max_requests: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do now: drop these (hopeless), launch the first `launch` of the rest, else look again
    at `wake_at` (or when something arrives)."""

    drop: tuple[int, ...] = ()      # indices into the pending sequence, ascending
    launch: int = 0
    wake_at: float | None = None


def _head(pending: Sequence[Pending], skip: frozenset[int], limits: Limits) -> list[int]:
    """Indices of the longest prefix (in arrival order, skipping `skip`) within the size caps.
    The first request always fits: one longer than the token cap runs alone."""
    chosen: list[int] = []
    tokens = 0
    for i, p in enumerate(pending):
        if i in skip:
            continue
        if chosen and (len(chosen) >= limits.max_requests or tokens + p.tokens > limits.max_tokens):
            break
        chosen.append(i)
        tokens += p.tokens
    return chosen


class NoBatching:
    """Baseline (a): one request per batch, started as soon as the engine is free."""

    name = "none"

    def plan(self, pending: Sequence[Pending], now: float, estimate: Estimate, limits: Limits,
             arrival_rate: float) -> Plan:
        return Plan(launch=1 if pending else 0)


class FixedWindow:
    """Baseline (b): a batch closes `window_s` after its oldest request arrived, or when full."""

    name = "window"

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s

    def plan(self, pending: Sequence[Pending], now: float, estimate: Estimate, limits: Limits,
             arrival_rate: float) -> Plan:
        if not pending:
            return Plan()
        head = _head(pending, frozenset(), limits)
        if len(head) < len(pending) or len(head) >= limits.max_requests:
            return Plan(launch=len(head))               # full
        close = pending[0].arrived + self.window_s
        return Plan(launch=len(head)) if now >= close else Plan(wake_at=close)


class DeadlineAware:
    """Policy (c): size caps, Wmax from the latency target, and the deadlines of the batch's members."""

    name = "deadline"

    def __init__(self, target_s: float, margin_s: float, min_wait_s: float = 0.0,
                 max_wait_s: float = math.inf) -> None:
        self.target_s, self.margin_s = target_s, margin_s
        self.min_wait_s, self.max_wait_s = min_wait_s, max_wait_s

    def max_wait(self, requests: int, tokens: int, estimate: Estimate) -> float:
        """Wmax for a batch of this shape: target - compute - margin, within [floor, ceiling]."""
        budget = self.target_s - estimate(requests, tokens) - self.margin_s
        return min(self.max_wait_s, max(self.min_wait_s, budget))

    def plan(self, pending: Sequence[Pending], now: float, estimate: Estimate, limits: Limits,
             arrival_rate: float) -> Plan:
        if not pending:
            return Plan()
        # Hopeless: even started now and alone it would finish after its deadline.
        drop = tuple(i for i, p in enumerate(pending)
                     if p.deadline is not None and now + estimate(1, p.tokens) > p.deadline)
        skip = frozenset(drop)
        chosen: list[int] = []
        tokens = 0
        due = math.inf                  # the earliest deadline among the chosen, less the margin
        for i in _head(pending, skip, limits):
            p = pending[i]
            p_due = min(due, p.deadline - self.margin_s) if p.deadline is not None else due
            # Grow only while every member can still finish in time (the first one always goes).
            if chosen and now + estimate(len(chosen) + 1, tokens + p.tokens) > p_due:
                break
            chosen.append(i)
            tokens += p.tokens
            due = p_due
        if not chosen:
            return Plan(drop=drop)
        rest = len(pending) - len(drop)
        if len(chosen) < rest or len(chosen) >= limits.max_requests:
            return Plan(drop=drop, launch=len(chosen))  # full (by size, tokens or the deadlines)
        oldest = pending[chosen[0]].arrived
        close = min(oldest + self.max_wait(len(chosen), tokens, estimate),
                    due - estimate(len(chosen), tokens))                 # the latest start that meets `due`
        if now >= close or arrival_rate * (close - now) < 1.0:
            return Plan(drop=drop, launch=len(chosen))  # time is up, or nobody is expected to join
        return Plan(drop=drop, wake_at=close)

"""When a unary engine's pending requests become a batch: the batch-closing rules, as pure functions.

A batch closes when it reaches the size cap (requests or tokens), when its oldest request has waited
Wmax, or when waiting longer would make a request in it miss its deadline. Wmax is derived, not set:
the latency target (the route's SLO) minus the estimated compute time of the batch as it stands minus
a margin, clamped to a configured floor and ceiling; it shrinks as the batch grows, so the oldest
request's expected latency (wait + compute) stays within the target. What makes it deadline-aware
rather than a timer:

- each request is due at the earlier of its deadline and its arrival + the target, less the margin;
  a batch takes requests (in arrival order) only while its estimated compute lets every member be on
  time. A request already too late for its target rides along without holding the batch back, and one
  that cannot meet its *deadline* even if started now, alone, is dropped before it costs compute (its
  answer would come too late to be of use);
- under overload the most urgent requests are the ones a big batch cannot save: when a batch was held
  back by a member's due and skipping the first few lets it serve more requests on time than it gives
  up, it skips them (they stay pending, or are dropped once hopeless) instead of collapsing every batch
  to the one urgent request (a batch cut by the size caps skips nothing: a long input is not passed
  over for ever);
- an idle engine does not wait for company it does not need: when a batch of the current size already
  computes requests faster than they arrive, waiting would only add latency, so it launches.

The fixed-window and no-batching policies exist as baselines (bench/unary_batching.py compares all
three). Nothing here touches asyncio or an engine, so every rule is tested with plain numbers.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Estimate = Callable[[int, int], float]      # (requests, tokens) -> seconds of compute
MAX_SKIP = 16                               # how many of the most urgent requests a batch may skip


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
    """What to do now: drop these (hopeless), launch these as one batch, else look again at `wake_at`
    (or when something arrives). Indices into the pending sequence, ascending."""

    drop: tuple[int, ...] = ()
    launch: tuple[int, ...] = ()
    wake_at: float | None = None


def _head(pending: Sequence[Pending], limits: Limits) -> tuple[int, ...]:
    """The longest prefix within the size caps. The first request always fits: one longer than the token
    cap runs alone."""
    tokens = 0
    for n, p in enumerate(pending):
        if n and (n >= limits.max_requests or tokens + p.tokens > limits.max_tokens):
            return tuple(range(n))
        tokens += p.tokens
    return tuple(range(len(pending)))


class NoBatching:
    """Baseline (a): one request per batch, started as soon as the engine is free."""

    name = "none"

    def plan(self, pending: Sequence[Pending], now: float, estimate: Estimate, limits: Limits,
             arrival_rate: float) -> Plan:
        return Plan(launch=(0,) if pending else ())


class FixedWindow:
    """Baseline (b): a batch closes `window_s` after its oldest request arrived, or when full."""

    name = "window"

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s

    def plan(self, pending: Sequence[Pending], now: float, estimate: Estimate, limits: Limits,
             arrival_rate: float) -> Plan:
        if not pending:
            return Plan()
        head = _head(pending, limits)
        if len(head) < len(pending) or len(head) >= limits.max_requests:
            return Plan(launch=head)                    # full
        close = pending[0].arrived + self.window_s
        return Plan(launch=head) if now >= close else Plan(wake_at=close)


@dataclass(frozen=True, slots=True)
class _Batch:
    members: tuple[int, ...]
    tokens: int
    due: float                      # the earliest `due` among its members (inf: none binds)
    cut: str | None                 # why something was left out: "cap" (size) or "due"; None: nothing was


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
        m = self.margin_s
        drop = tuple(i for i, p in enumerate(pending)
                     if p.deadline is not None and now + estimate(1, p.tokens) > p.deadline - m)
        dropped = set(drop)
        order = [i for i in range(len(pending)) if i not in dropped]
        if not order:
            return Plan(drop=drop)
        best, skipped = self._grow(pending, order, 0, now, estimate, limits), 0
        if best.cut == "due":                                       # held back by an urgent member?
            for j in range(1, min(len(order), MAX_SKIP + 1)):
                batch = self._grow(pending, order, j, now, estimate, limits)
                if len(batch.members) - j > len(best.members) - skipped:
                    best, skipped = batch, j
        n, tokens = len(best.members), best.tokens
        if skipped or best.cut or n >= limits.max_requests:
            return Plan(drop=drop, launch=best.members)             # full, or the urgent ones skipped
        close = min(pending[best.members[0]].arrived + self.max_wait(n, tokens, estimate),
                    best.due - estimate(n, tokens))                 # the latest start that meets `due`
        compute = estimate(n, tokens)
        keeping_up = compute <= 0 or n / compute >= arrival_rate
        if now >= close or keeping_up:
            return Plan(drop=drop, launch=best.members)             # time is up, or waiting buys nothing
        return Plan(drop=drop, wake_at=close)

    def _grow(self, pending: Sequence[Pending], order: Sequence[int], start: int, now: float, estimate: Estimate,
              limits: Limits) -> _Batch:
        """The longest run of `order[start:]` within the caps whose every member is due after the batch's
        estimated end. A member already too late for its target does not hold the batch back; its
        deadline (it is not hopeless: those were dropped) always does."""
        members: list[int] = []
        tokens, due = 0, math.inf
        for k in range(start, len(order)):
            p = pending[order[k]]
            if members and (len(members) >= limits.max_requests or tokens + p.tokens > limits.max_tokens):
                return _Batch(tuple(members), tokens, due, "cap")
            own = p.deadline - self.margin_s if p.deadline is not None else math.inf
            target = p.arrived + self.target_s - self.margin_s
            if now + estimate(1, p.tokens) <= target:
                own = min(own, target)
            if members and now + estimate(len(members) + 1, tokens + p.tokens) > min(due, own):
                return _Batch(tuple(members), tokens, due, "due")
            members.append(order[k])
            tokens += p.tokens
            due = min(due, own)
        return _Batch(tuple(members), tokens, due, None)

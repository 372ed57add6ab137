"""Canary rollouts with automatic rollback.

A `Rollout` moves one route (an alias, or a model name) from `stable` to `candidate` through
`steps` of candidate weight. Every candidate completion (and `tick()`, for a timer) re-judges the
candidate against stable on the current step's windows: error rate, TTFT p95, inter-token latency
p95 and cost per 1k tokens. A breach swaps the routing table back to 100% stable inside the same
call, so the next request already goes to stable; the audit log records what was breached.

State machine: idle -> running(step i) <-> paused -> promoted | rolled_back. A step advances only
when its dwell has passed, both windows hold `min_samples` requests and nothing is breached.
Paused holds the weights but still rolls back on a breach. Windows reset at every step, except
that stable's window is kept as the baseline when the candidate reaches 100% (stable gets no
traffic then). Single-threaded: call everything on the event loop.

The per-version windows are `inferd.models.version_stats`; the config tables are `inferd.config.rollouts`.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import msgspec

from inferd.config import Arm, PriceConfig, RolloutConfig, RolloutThresholds, Split, parse_target, price_for
from inferd.models.registry import ModelRegistry
from inferd.models.routing import RoutingTable
from inferd.models.version_stats import VersionStats, WindowSummary
from inferd.observability import SYSTEM_ACTOR, AuditLog
from inferd.types import ModelVersion

Phase = Literal["idle", "running", "paused", "promoted", "rolled_back"]


class RolloutError(Exception):
    """A control that the rollout's state does not allow (the admin API answers 409)."""

    status = 409


class RolloutNotFound(RolloutError):
    status = 404


class RolloutStatus(msgspec.Struct, frozen=True):
    """What the admin endpoint shows for one rollout."""

    name: str
    phase: Phase
    stable: str
    candidate: str
    steps: tuple[float, ...]
    step: int                          # index into steps; -1 before start
    candidate_weight: float            # the weight routing uses right now
    min_dwell_s: float
    dwell_elapsed_s: float | None      # time on this step (None unless running or paused)
    stable_window: WindowSummary
    candidate_window: WindowSummary
    reason: str | None                 # why it ended (rollback / promotion), or why it is paused


class Rollout:
    """One route's move from `stable` to `candidate`. See the module docstring for the rules."""

    def __init__(self, name: str, registry: ModelRegistry, *, stable: ModelVersion, candidate: ModelVersion,
                 steps: Sequence[float] = (0.01, 0.05, 0.25, 1.0), min_dwell_s: float = 600.0,
                 thresholds: RolloutThresholds = RolloutThresholds(),
                 prices: Mapping[str, PriceConfig] | None = None, audit: AuditLog | None = None,
                 clock: Callable[[], float] = time.monotonic, window_size: int = 1024,
                 rng: random.Random | None = None) -> None:
        if not steps or any(not 0 < w <= 1 for w in steps) or any(a >= b for a, b in zip(steps, steps[1:])):
            raise ValueError(f"steps must be increasing weights in (0, 1], got {list(steps)}")
        if stable == candidate:
            raise ValueError("stable and candidate are the same version")
        self.name, self.registry = name, registry
        self.stable, self.candidate = stable, candidate
        self.steps = tuple(float(w) for w in steps)
        self.min_dwell_s, self.thresholds = min_dwell_s, thresholds
        self._prices = dict(prices or {})
        self._audit, self._clock, self._window_size = audit, clock, window_size
        self._rng = rng or random.Random()
        self.phase: Phase = "idle"
        self.step = -1
        self.reason: str | None = None
        self._step_started: float | None = None
        self._stable_stats = self._new_stats(stable)
        self._cand_stats = self._new_stats(candidate)

    @classmethod
    def from_config(cls, name: str, cfg: RolloutConfig, registry: ModelRegistry, *,
                    defaults: Mapping[str, str], prices: Mapping[str, PriceConfig] | None = None,
                    audit: AuditLog | None = None, clock: Callable[[], float] = time.monotonic) -> Rollout:
        return cls(name, registry, stable=parse_target(cfg.stable, defaults),
                   candidate=parse_target(cfg.candidate, defaults), steps=cfg.steps, min_dwell_s=cfg.min_dwell_s,
                   thresholds=cfg.thresholds, prices=prices, audit=audit, clock=clock, window_size=cfg.window_size)

    def _new_stats(self, key: ModelVersion) -> VersionStats:
        return VersionStats(capacity=self._window_size, price=price_for(self._prices, key), rng=self._rng)

    @property
    def active(self) -> bool:
        return self.phase in ("running", "paused")

    @property
    def weight(self) -> float:
        if self.phase == "promoted":
            return 1.0
        return self.steps[self.step] if self.active else 0.0

    # -- controls ---------------------------------------------------------------------------
    def start(self, actor: str = SYSTEM_ACTOR, reason: str | None = None) -> None:
        self._require(("idle",), "start")
        table = self.registry.table
        for key in (self.stable, self.candidate):
            if not table.is_ready(key):
                raise RolloutError(f"cannot start rollout {self.name!r}: {key} is not loaded and ready")
        if table.split_for(self.name) is None and self.name not in table.models():
            raise RolloutError(f"cannot start rollout {self.name!r}: no alias or model of that name")
        self._enter_step(0, actor, "rollout.start", reason)

    def pause(self, actor: str, reason: str | None = None) -> None:
        self._require(("running",), "pause")
        self._transition("paused", actor, "rollout.pause", reason)

    def resume(self, actor: str, reason: str | None = None) -> None:
        """Back to running; the current step's dwell starts over (the paused time is not evidence)."""
        self._require(("paused",), "resume")
        self._step_started = self._clock()
        self._transition("running", actor, "rollout.resume", reason)

    def promote(self, actor: str, reason: str | None = None) -> None:
        self._require(("running", "paused"), "promote")
        self._finish("promoted", actor, reason or "promoted by an operator")

    def rollback(self, actor: str, reason: str) -> None:
        self._require(("running", "paused"), "roll back")
        self._finish("rolled_back", actor, reason)

    def _require(self, phases: tuple[Phase, ...], what: str) -> None:
        if self.phase not in phases:
            raise RolloutError(f"cannot {what} rollout {self.name!r}: it is {self.phase}")

    # -- evidence ---------------------------------------------------------------------------
    def record(self, version: ModelVersion, ok: bool, ttft_s: float | None,
               itl_s: float | Sequence[float] | None, prompt_tokens: int, completion_tokens: int) -> None:
        """One finished live request of `version`; a candidate completion re-judges at once."""
        if not self.active:
            return
        if version == self.candidate:
            self._cand_stats.record(ok, ttft_s, itl_s, prompt_tokens, completion_tokens)
            self.evaluate()
        elif version == self.stable:
            self._stable_stats.record(ok, ttft_s, itl_s, prompt_tokens, completion_tokens)

    def tick(self) -> None:
        """For a timer: advance a step whose dwell passed since the last completion."""
        if self.active:
            self.evaluate()

    def breaches(self) -> list[str]:
        """Why the candidate is worse than allowed (empty: healthy or not enough samples yet)."""
        t = self.thresholds
        cand, stab = self._cand_stats, self._stable_stats
        if cand.requests < t.min_samples or stab.requests < t.min_samples:
            return []
        out = []
        ce, se = cand.error_rate, stab.error_rate
        if ce > se + t.max_error_rate_increase:
            out.append(f"error_rate: candidate {ce:.2%} > stable {se:.2%} + {t.max_error_rate_increase:.2%} "
                       f"(n={cand.requests}/{stab.requests})")
        for metric, ratio, c, s in (("ttft_p95", t.max_ttft_p95_ratio, cand.ttft.p95(), stab.ttft.p95()),
                                    ("itl_p95", t.max_itl_p95_ratio, cand.itl.p95(), stab.itl.p95())):
            if c is not None and s is not None and c > ratio * s + t.latency_slack_s:
                out.append(f"{metric}: candidate {c * 1000:.1f} ms > {ratio:g} x stable {s * 1000:.1f} ms"
                           + (f" + {t.latency_slack_s * 1000:.1f} ms" if t.latency_slack_s else ""))
        cc, sc = cand.cost_per_1k(), stab.cost_per_1k()
        if cc is not None and sc is not None and cc > t.max_cost_ratio * sc:
            out.append(f"cost_per_1k: candidate {cc:.6g} > {t.max_cost_ratio:g} x stable {sc:.6g}")
        return out

    def evaluate(self) -> None:
        breaches = self.breaches()
        if breaches:
            self._finish("rolled_back", SYSTEM_ACTOR, "automatic rollback: " + "; ".join(breaches))
            return
        if self.phase != "running" or self._clock() - self._step_started < self.min_dwell_s:
            return
        n = self.thresholds.min_samples
        if self._cand_stats.requests < n or self._stable_stats.requests < n:
            return  # the dwell passed but there is not yet enough evidence to call it healthy
        if self.step + 1 < len(self.steps):
            self._enter_step(self.step + 1, SYSTEM_ACTOR, "rollout.step", "healthy for the dwell")
        else:
            self._finish("promoted", SYSTEM_ACTOR, "healthy through every step")

    # -- transitions ------------------------------------------------------------------------
    def _apply(self, table: RoutingTable, candidate_weight: float) -> RoutingTable:
        if self.name not in table.aliases and self.name not in table.models():
            return table  # a reload dropped the route: nothing routes by it any more
        current = table.split_for(self.name) or Split.single(self.stable)
        arms = (Arm(self.candidate, candidate_weight), Arm(self.stable, 1.0 - candidate_weight))
        return table.with_split(self.name, current.with_arms(*arms))

    def _set_weights(self, candidate_weight: float) -> None:
        self.registry.swap(lambda table: self._apply(table, candidate_weight))

    def overlay(self, table: RoutingTable) -> RoutingTable:
        """`table` with this rollout's current weights (for a reload: the decision survives it).
        Idle rollouts, and routes the new table no longer has, leave the table as it is."""
        return table if self.phase == "idle" else self._apply(table, self.weight)

    def _enter_step(self, step: int, actor: str, action: str, reason: str | None) -> None:
        before = self._snapshot()
        detail = self._evidence() if step > 0 else None
        self._set_weights(self.steps[step])
        self.phase, self.step, self._step_started = "running", step, self._clock()
        self._cand_stats = self._new_stats(self.candidate)
        if self.steps[step] < 1.0:  # at 100% stable gets no traffic: keep its window as the baseline
            self._stable_stats = self._new_stats(self.stable)
        self._log(actor, action, before, reason, detail)

    def _transition(self, phase: Phase, actor: str, action: str, reason: str | None) -> None:
        before = self._snapshot()
        self.phase = phase
        self.reason = reason if phase == "paused" else None
        self._log(actor, action, before, reason, None)

    def _finish(self, phase: Phase, actor: str, reason: str) -> None:
        before, detail = self._snapshot(), self._evidence()
        self._set_weights(1.0 if phase == "promoted" else 0.0)   # the swap: from here on, new routing
        self.phase, self.reason, self._step_started = phase, reason, None
        self._log(actor, "rollout.promote" if phase == "promoted" else "rollout.rollback", before, reason, detail)

    def _snapshot(self) -> dict:
        return {"phase": self.phase, "step": self.step,
                "weights": {str(self.candidate): self.weight, str(self.stable): 1.0 - self.weight}}

    def _evidence(self) -> dict:
        return {"stable": msgspec.structs.asdict(self._stable_stats.summary()),
                "candidate": msgspec.structs.asdict(self._cand_stats.summary())}

    def _log(self, actor: str, action: str, before: dict, reason: str | None, detail: dict | None) -> None:
        if self._audit is not None:
            self._audit.append(actor, action, target=self.name, before=before, after=self._snapshot(),
                               reason=reason, detail=detail)

    def state(self) -> RolloutStatus:
        elapsed = None if self._step_started is None else self._clock() - self._step_started
        return RolloutStatus(self.name, self.phase, str(self.stable), str(self.candidate), self.steps, self.step,
                             self.weight, self.min_dwell_s, elapsed, self._stable_stats.summary(),
                             self._cand_stats.summary(), self.reason)


class RolloutManager:
    """The daemon's rollouts by route name; fans completions out to the rollouts watching a version."""

    def __init__(self) -> None:
        self._rollouts: dict[str, Rollout] = {}
        self._watch: dict[ModelVersion, list[Rollout]] = {}

    def add(self, rollout: Rollout) -> None:
        """Register a rollout; replaces a finished one of the same name, never an active one."""
        old = self._rollouts.get(rollout.name)
        if old is not None and old.active:
            raise RolloutError(f"rollout {rollout.name!r} is {old.phase}; finish it first")
        self._rollouts[rollout.name] = rollout
        self._rewatch()

    def _rewatch(self) -> None:
        self._watch = {}
        for r in self._rollouts.values():
            for key in (r.stable, r.candidate):
                self._watch.setdefault(key, []).append(r)

    def remove(self, name: str) -> None:
        """Forget a finished rollout, so a reload restores the configured split of its route."""
        if self.get(name).active:
            raise RolloutError(f"rollout {name!r} is {self._rollouts[name].phase}; finish it first")
        del self._rollouts[name]
        self._rewatch()

    def active_versions(self) -> set[ModelVersion]:
        """The stable and candidate versions of every rollout under way (the lifecycle never evicts them)."""
        return {key for r in self._rollouts.values() if r.active for key in (r.stable, r.candidate)}

    def overlay(self, table: RoutingTable) -> RoutingTable:
        """Re-apply every rollout's weights to a freshly loaded table. A reload does
        `registry.swap(lambda t: manager.overlay(t.with_routes(...)))`: one swap, no gap."""
        for r in self._rollouts.values():
            table = r.overlay(table)
        return table

    def get(self, name: str) -> Rollout:
        try:
            return self._rollouts[name]
        except KeyError:
            raise RolloutNotFound(f"no rollout named {name!r}") from None

    def record(self, version: ModelVersion, ok: bool, ttft_s: float | None,
               itl_s: float | Sequence[float] | None, prompt_tokens: int, completion_tokens: int) -> None:
        for r in self._watch.get(version, ()):
            r.record(version, ok, ttft_s, itl_s, prompt_tokens, completion_tokens)

    def tick(self) -> None:
        for r in self._rollouts.values():
            r.tick()

    def states(self) -> list[RolloutStatus]:
        return [r.state() for r in self._rollouts.values()]

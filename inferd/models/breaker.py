"""Circuit breakers per loaded model version: stop sending a failing version traffic, then probe it.

closed -> open when, within `window_s`, at least `min_requests` requests ended and `error_rate` of
them failed; open -> half-open once `cooldown_s` has passed; half-open lets `half_open_requests`
probes through: that many successes close it, one failure opens it again. A half-open breaker whose
probes never report (their clients left) lets a new set through after another cool-down.

A failure is what says something about the version: an engine error, a refusal at submit (or an
engine found unhealthy), or a first token later than `slow_ttft_s` after the engine got the request
(a timeout of the engine's own: time queued in admission is overload, not failure, and a client's own
short deadline says nothing about the version; neither is counted). Transitions go to the log, the
audit log and metrics.
Loop thread only.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from inferd.config import BreakerConfig, ModelConfig
from inferd.observability import SYSTEM_ACTOR, get_logger
from inferd.slo import BucketRing
from inferd.types import ModelVersion

log = get_logger("inferd.breaker")
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class BreakerOpen(Exception):
    """The version's breaker refuses requests for now; `retry_after_s` until it probes again."""

    def __init__(self, key: ModelVersion, retry_after_s: float) -> None:
        super().__init__(f"{key} is failing; its circuit breaker is open")
        self.key = key
        self.retry_after_s = retry_after_s


class BreakerState(msgspec.Struct, frozen=True):
    model: str
    version: str
    state: str
    transitions: dict[str, int]      # by the state entered


class CircuitBreaker:
    def __init__(self, key: ModelVersion, config: BreakerConfig, clock: Callable[[], float],
                 on_change: Callable[[CircuitBreaker, str, str, dict[str, Any]], None]) -> None:
        self.key = key
        self.config = config
        self.state = CLOSED
        self.transitions = {CLOSED: 0, OPEN: 0, HALF_OPEN: 0}
        self._clock = clock
        self._on_change = on_change
        self._ring = BucketRing(1.0, max(1, math.ceil(config.window_s)))
        self._since = clock()           # when the current state was entered
        self._probes = self._successes = 0

    def check(self) -> None:
        """Let a request through, or raise BreakerOpen."""
        if self.state == CLOSED:
            return
        now = self._clock()
        left = self._since + self.config.cooldown_s - now
        if self.state == OPEN:
            if left > 0:
                raise BreakerOpen(self.key, left)
            self._enter(HALF_OPEN, now, {})
        elif left <= 0 and self._probes >= self.config.half_open_requests:   # probes that never reported
            self._since, self._probes = now, 0
        if self._probes >= self.config.half_open_requests:
            raise BreakerOpen(self.key, max(1.0, left))
        self._probes += 1

    def record(self, ok: bool) -> None:
        now = self._clock()
        if self.state == HALF_OPEN:
            if not ok:
                self._enter(OPEN, now, {"reason": "a probe failed"})
                return
            self._successes += 1
            if self._successes >= self.config.half_open_requests:
                self._enter(CLOSED, now, {"probes": self._successes})
            return
        if self.state == OPEN:
            return                  # a straggler admitted before it opened
        self._ring.add(now, ok)
        good, bad = self._ring.totals(now, self.config.window_s)
        total = good + bad
        if total >= self.config.min_requests and bad >= self.config.error_rate * total:
            self._enter(OPEN, now, {"failed": bad, "requests": total, "window_s": self.config.window_s})

    def _enter(self, state: str, now: float, detail: dict[str, Any]) -> None:
        before, self.state, self._since = self.state, state, now
        self.transitions[state] += 1
        self._probes = self._successes = 0
        if state == CLOSED:
            self._ring = BucketRing(1.0, self._ring.count)
        self._on_change(self, before, state, detail)


class Breakers:
    """The breakers of every loaded version whose model has a `[models.<name>.breaker]`."""

    def __init__(self, models: Mapping[str, ModelConfig], *, audit: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._audit = audit
        self._breakers: dict[ModelVersion, CircuitBreaker] = {}
        self._configs: dict[str, BreakerConfig] = {}
        self.reconfigure(models)

    def reconfigure(self, models: Mapping[str, ModelConfig]) -> None:
        """A reload: breakers of models whose breaker config changed (or went) start afresh."""
        self._configs = {name: m.breaker for name, m in models.items() if m.breaker is not None}
        self._breakers = {k: b for k, b in self._breakers.items() if self._configs.get(k.model) == b.config}

    def forget(self, key: ModelVersion) -> None:
        """`key` was unloaded: its breaker (and its series) go with it."""
        self._breakers.pop(key, None)

    def fallback(self, model: str) -> str | None:
        cfg = self._configs.get(model)
        return cfg.fallback if cfg is not None else None

    def _get(self, key: ModelVersion) -> CircuitBreaker | None:
        breaker = self._breakers.get(key)
        if breaker is None:
            cfg = self._configs.get(key.model)
            if cfg is None:
                return None
            breaker = self._breakers[key] = CircuitBreaker(key, cfg, self._clock, self._changed)
        return breaker

    def check(self, key: ModelVersion) -> None:
        """Raise BreakerOpen when `key`'s breaker refuses a request now."""
        breaker = self._get(key)
        if breaker is not None:
            breaker.check()

    def record(self, key: ModelVersion, ok: bool, ttft_s: float | None) -> None:
        breaker = self._get(key)
        if breaker is None:
            return
        slow = breaker.config.slow_ttft_s
        breaker.record(ok and not (slow is not None and ttft_s is not None and ttft_s > slow))

    def open_versions(self) -> dict[str, str]:
        """`model@version` -> state, for breakers not closed (/readyz)."""
        return {str(k): b.state for k, b in sorted(self._breakers.items()) if b.state != CLOSED}

    def snapshot(self) -> list[BreakerState]:
        return [BreakerState(k.model, k.version, b.state, dict(b.transitions))
                for k, b in sorted(self._breakers.items())]

    def _changed(self, breaker: CircuitBreaker, before: str, after: str, detail: dict[str, Any]) -> None:
        key = breaker.key
        log.warning("breaker_" + after, model=key.model, version=key.version, previous=before, **detail)
        if self._audit is not None:
            self._audit.append(SYSTEM_ACTOR, "breaker." + after, target=str(key), before=before, after=after,
                               detail=detail or None)

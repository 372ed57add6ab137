"""Per-version metric windows: exact request/error/token counts and sampled latencies.

`VersionStats` is one version's window (a rollout keeps one per version per step);
`ShadowRecorder` keeps cumulative stats of mirrored (shadow) requests apart from live traffic.
"""
from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

import msgspec

from inferd.config import PriceConfig, price_for
from inferd.types import ModelVersion

ITL_SAMPLES_PER_REQUEST = 16   # bounded per-request cost when a caller passes every token gap


class WindowSummary(msgspec.Struct, frozen=True):
    requests: int
    errors: int
    error_rate: float | None
    ttft_p95_s: float | None
    itl_p95_s: float | None
    cost_per_1k: float | None
    prompt_tokens: int
    completion_tokens: int


class _Reservoir:
    """A uniform sample of at most `capacity` values (Algorithm R) with a cached p95."""

    __slots__ = ("capacity", "values", "seen", "_rng", "_p95")

    def __init__(self, capacity: int, rng: random.Random) -> None:
        self.capacity, self.values, self.seen, self._rng, self._p95 = capacity, [], 0, rng, None

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.capacity:
            self.values.append(value)
        else:
            j = self._rng.randrange(self.seen)
            if j >= self.capacity:
                return
            self.values[j] = value
        self._p95 = None

    def p95(self) -> float | None:
        if self._p95 is None and self.values:
            ordered = sorted(self.values)
            self._p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
        return self._p95


class VersionStats:
    """One version's requests in one window: exact counts, sampled latencies (bounded memory)."""

    def __init__(self, *, capacity: int = 1024, price: PriceConfig | None = None,
                 rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self.price = price
        self.requests = self.errors = self.prompt_tokens = self.completion_tokens = 0
        self.ttft = _Reservoir(capacity, self._rng)
        self.itl = _Reservoir(capacity, self._rng)

    def record(self, ok: bool, ttft_s: float | None, itl_s: float | Sequence[float] | None,
               prompt_tokens: int, completion_tokens: int) -> None:
        """One finished request. `itl_s` is the request's inter-token latency (a mean or p95 of
        its gaps) or the gaps themselves (at most ITL_SAMPLES_PER_REQUEST of them are sampled)."""
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if not ok:
            self.errors += 1
            return  # a failed request's latencies describe the failure, not the version's speed
        if ttft_s is not None:
            self.ttft.add(ttft_s)
        if itl_s is None:
            return
        if isinstance(itl_s, (int, float)):
            self.itl.add(float(itl_s))
            return
        gaps = itl_s if len(itl_s) <= ITL_SAMPLES_PER_REQUEST else self._rng.sample(
            list(itl_s), ITL_SAMPLES_PER_REQUEST)
        for gap in gaps:
            self.itl.add(gap)

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def cost_per_1k(self) -> float | None:
        tokens = self.prompt_tokens + self.completion_tokens
        if self.price is None or not tokens:
            return None
        return self.price.cost(self.prompt_tokens, self.completion_tokens) * 1000 / tokens

    def summary(self) -> WindowSummary:
        return WindowSummary(self.requests, self.errors, self.error_rate, self.ttft.p95(), self.itl.p95(),
                             self.cost_per_1k(), self.prompt_tokens, self.completion_tokens)


class ShadowRecorder:
    """Stats of mirrored (shadow) requests per version, kept apart from live traffic.

    `mirrored()` when a shadow copy is handed to admission, `dropped()` when admission sheds it,
    `record()` when it finishes. Counters are cumulative; latencies are a bounded sample.
    """

    def __init__(self, *, prices: Mapping[str, PriceConfig] | None = None, capacity: int = 1024,
                 rng: random.Random | None = None) -> None:
        self._prices = dict(prices or {})
        self._capacity = capacity
        self._rng = rng or random.Random()
        self._stats: dict[ModelVersion, VersionStats] = {}
        self._mirrored: dict[ModelVersion, int] = {}
        self._dropped: dict[ModelVersion, int] = {}

    def set_prices(self, prices: Mapping[str, PriceConfig]) -> None:
        """A reload's [prices]: for versions first seen from now on (stats already kept keep theirs)."""
        self._prices = dict(prices)

    def _get(self, key: ModelVersion) -> VersionStats:
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = VersionStats(capacity=self._capacity, price=price_for(self._prices, key),
                                                    rng=self._rng)
        return stats

    def mirrored(self, key: ModelVersion) -> None:
        self._mirrored[key] = self._mirrored.get(key, 0) + 1

    def dropped(self, key: ModelVersion) -> None:
        self._dropped[key] = self._dropped.get(key, 0) + 1

    def record(self, key: ModelVersion, ok: bool, ttft_s: float | None, itl_s: float | Sequence[float] | None,
               prompt_tokens: int, completion_tokens: int) -> None:
        self._get(key).record(ok, ttft_s, itl_s, prompt_tokens, completion_tokens)

    def stats(self, key: ModelVersion) -> VersionStats:
        return self._get(key)

    def summary(self) -> dict[str, dict]:
        keys = set(self._stats) | set(self._mirrored) | set(self._dropped)
        return {str(k): {"mirrored": self._mirrored.get(k, 0), "dropped": self._dropped.get(k, 0),
                         **msgspec.structs.asdict(self._get(k).summary())} for k in sorted(keys)}

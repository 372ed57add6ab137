"""Per-request observation on the hot path: label children bound once per loaded model version.

A request gets a `RequestObservation` with pre-bound label children; inter-token latency is
observed once per delta the client receives (the gap divided by the delta's token count), not once
per token: a histogram observe costs ~2 us, which at 85k tokens/s would be a fifth of a core, while
deltas are coalesced to what the client can take. Even once per frame that was a fifth of the SSE
writer's CPU, so those observations are counted into plain per-bucket integers on the loop thread
(`LoopHistogram`) and folded into the Prometheus histogram when /metrics renders.

The series themselves are declared in `inferd.observability.metrics.Metrics` (a SeriesFamilies).
"""
from __future__ import annotations

import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

    from inferd.engine import Engine
    from inferd.types import EngineTiming, Usage


class SeriesFamilies(Protocol):
    """The labelled families a ModelSeries binds its children from (inferd.observability.metrics.Metrics)."""

    requests_total: Counter
    time_to_first_token: Histogram
    inter_token_latency: Histogram
    stream_write_delay: Histogram
    queue_wait: Histogram
    request_stage: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    e2e_request_latency: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    prefix_cache_hit_tokens: Counter
    engine_step: Histogram

    def loop_observer(self, child: Any) -> Callable[[float], None]: ...
    def loop_histogram(self, child: Any) -> LoopHistogram | None: ...


class LoopHistogram:
    """Observations of one histogram child made on the event-loop thread, folded in at render time.

    The child's own observe() takes two locks and scans its buckets; this is a bisect and two adds.
    It relies on prometheus_client's Histogram child layout (`_upper_bounds`, `_buckets`, `_sum`);
    `for_child` returns None when that is not there, and callers then observe directly.
    """

    __slots__ = ("_child", "_bounds", "_counts", "_sum", "_pending")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._bounds = list(child._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = False

    @classmethod
    def for_child(cls, child: Any) -> LoopHistogram | None:
        if all(hasattr(child, a) for a in ("_upper_bounds", "_buckets", "_sum")):
            return cls(child)
        return None

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1    # the first bucket with amount <= bound
        self._sum += amount
        self._pending = True

    def add(self, counts: list[int], total: float) -> None:
        """Observations made elsewhere, as counts per bucket (these bounds, +Inf last) and their sum; a list of
        another length (other bounds) is ignored."""
        if len(counts) != len(self._counts):
            return
        for i, n in enumerate(counts):
            self._counts[i] += n
        self._sum += total
        self._pending = True

    def fold(self) -> None:
        if not self._pending:
            return
        counts, buckets = self._counts, self._child._buckets
        for i, n in enumerate(counts):
            if n:
                buckets[i].inc(n)
                counts[i] = 0
        self._child._sum.inc(self._sum)
        self._sum = 0.0
        self._pending = False


class ModelSeries:
    """Label children of one loaded model, bound once so the hot path skips `.labels()` lookups."""

    __slots__ = ("_engine", "labels", "ttft", "itl", "itl_observe", "write_delay_observe", "queue_wait", "prefill",
                 "decode", "e2e", "prompt_tokens", "generation_tokens", "prefix_hits", "step", "_stages",
                 "_by_status", "_metrics", "_write_delays", "_itls", "ttft_observe", "queue_wait_observe", "prefill_observe", "decode_observe",
                 "e2e_observe")

    def __init__(self, metrics: SeriesFamilies, engine: Engine | None, labels: tuple[str, str, str]) -> None:
        # Weakly: a series outlives its version (its counters stay exported), the engine must not (a retired
        # version's weights and KV cache are freed once nothing else holds it).
        self._engine = weakref.ref(engine) if engine is not None else None
        self.labels = labels
        self._metrics = metrics
        self.ttft = metrics.time_to_first_token.labels(*labels)
        self.itl = metrics.inter_token_latency.labels(*labels)
        self.itl_observe = metrics.loop_observer(self.itl)   # per frame: loop thread only
        write_delay = metrics.stream_write_delay.labels(*labels)
        self.write_delay_observe = metrics.loop_observer(write_delay)     # ditto
        self._write_delays = metrics.loop_histogram(write_delay)         # the same, for the writers' DELAYS
        self._itls = metrics.loop_histogram(self.itl)                    # and the writers' ITLs
        self.queue_wait = metrics.queue_wait.labels(*labels)
        self.prefill = metrics.prefill_time.labels(*labels)
        self.decode = metrics.decode_time.labels(*labels)
        self.e2e = metrics.e2e_request_latency.labels(*labels)
        self.prompt_tokens = metrics.prompt_tokens.labels(*labels)
        self.generation_tokens = metrics.generation_tokens.labels(*labels)
        self.prefix_hits = metrics.prefix_cache_hit_tokens.labels(*labels)
        self.step = metrics.engine_step.labels(*labels)
        # Each request's observations, on the loop thread: LoopHistogram's bisect, not the child's two locks.
        self.ttft_observe = metrics.loop_observer(self.ttft)
        self.queue_wait_observe = metrics.loop_observer(self.queue_wait)
        self.prefill_observe = metrics.loop_observer(self.prefill)
        self.decode_observe = metrics.loop_observer(self.decode)
        self.e2e_observe = metrics.loop_observer(self.e2e)
        self._stages: dict[str, Callable[[float], None]] = {}
        self._by_status: dict[int | str, Any] = {}      # requests_total's children: a bounded set of statuses

    def add_write_delays(self, counts: list[int], total: float) -> None:
        """Write delays another process observed (an SSE writer's DELAYS): counts per bucket of
        inferd_stream_write_delay_seconds, +Inf last, and their sum. Loop thread only."""
        if self._write_delays is not None:
            self._write_delays.add(counts, total)

    def add_itls(self, counts: list[int], total: float) -> None:
        """Inter-token latencies an SSE writer observed (DELAYS) as the frames of the streams it writes left:
        counts per bucket of inferd_inter_token_latency_seconds, +Inf last, and their sum. Loop thread only."""
        if self._itls is not None:
            self._itls.add(counts, total)

    def stage_observe(self, name: str) -> Callable[[float], None]:
        """observe() of the stage histogram's child for `name` (a bounded set: the pipeline's timeline stages),
        for the loop thread."""
        observe = self._stages.get(name)
        if observe is None:
            child = self._metrics.request_stage.labels(*self.labels, name)
            observe = self._stages[name] = self._metrics.loop_observer(child)
        return observe

    def serves(self, engine: Engine) -> bool:
        """Whether this series is bound to `engine` (a reloaded version gets a series of its own)."""
        return self._engine is not None and self._engine() is engine

    def count_request(self, status: int | str) -> None:
        child = self._by_status.get(status)
        if child is None:      # `.labels()` validates and locks on every call: once per status
            child = self._by_status[status] = self._metrics.requests_total.labels(*self.labels, str(status))
        child.inc()

    def observe_step(self, seconds: float) -> None:
        """One engine step took `seconds`. Thread-safe: engines may call it from their step thread."""
        self.step.observe(seconds)


class RequestObservation:
    """Timing of one request as the client sees it. Create at arrival; feed deltas; finish once."""

    __slots__ = ("series", "arrival", "_last_token", "ttft", "mean_itl", "latency", "_finished")

    def __init__(self, series: ModelSeries, arrival: float | None = None) -> None:
        self.series = series
        self.arrival = time.monotonic() if arrival is None else arrival
        self._last_token: float | None = None
        self.ttft: float | None = None
        self.mean_itl: float | None = None    # set by finish(): decode time / gaps, two or more tokens
        self.latency: float | None = None     # set by finish(): arrival to the end of the response
        self._finished = False

    def on_tokens(self, n_tokens: int, now: float | None = None, pushed_at: float | None = None) -> None:
        """The client was just sent a delta carrying `n_tokens` new tokens, the oldest of which the
        engine pushed at `pushed_at` (the SSE writer knows; inferd_stream_write_delay_seconds)."""
        if n_tokens <= 0:
            return
        now = time.monotonic() if now is None else now
        if pushed_at is not None:
            self.series.write_delay_observe(now - pushed_at)
        if self._last_token is None:
            self.ttft = now - self.arrival
            self.series.ttft_observe(self.ttft)
            n_tokens -= 1  # the first token's latency is TTFT; the rest of the delta arrived with it
            if n_tokens:
                self.series.itl_observe(0.0)
        else:
            self.series.itl_observe((now - self._last_token) / n_tokens)
        self._last_token = now

    def last_token_at(self, when: float) -> None:
        """Tokens after the first went out through another process (an SSE writer, which observes their ITLs
        itself), the last of them at `when`: finish's mean ITL reads it."""
        if self._last_token is not None and when > self._last_token:
            self._last_token = when

    def finish(self, status: int | str, *, usage: Usage | None = None, timing: EngineTiming | None = None,
               now: float | None = None, stages: Mapping[str, tuple[float, float]] | None = None) -> None:
        """Count the request and record e2e latency, queue wait, its `stages` (name -> (start, end),
        monotonic seconds: the same as its Server-Timing) and token counters. Idempotent."""
        if self._finished:
            return
        self._finished = True
        now = time.monotonic() if now is None else now
        s = self.series
        s.count_request(status)
        self.latency = now - self.arrival
        s.e2e_observe(self.latency)
        tokens = usage.completion_tokens if usage is not None else 0
        if self._last_token is not None:
            if tokens > 1 and self.ttft is not None:     # as the client saw them
                self.mean_itl = max(0.0, self._last_token - self.arrival - self.ttft) / (tokens - 1)
        elif timing is not None and timing.first_token is not None:
            # Nothing was streamed (a non-streaming response): the engine's stamps stand in for
            # when tokens would have reached a streaming client; one mean ITL observation.
            self.ttft = max(0.0, timing.first_token - self.arrival)
            s.ttft_observe(self.ttft)
            if tokens > 1 and timing.finished is not None:
                self.mean_itl = max(0.0, timing.finished - timing.first_token) / (tokens - 1)
                s.itl_observe(self.mean_itl)
        if timing is not None and timing.first_scheduled is not None:
            s.queue_wait_observe(max(0.0, timing.first_scheduled - self.arrival))
            if timing.first_token is not None:
                s.prefill_observe(max(0.0, timing.first_token - timing.first_scheduled))
                if timing.finished is not None:
                    s.decode_observe(max(0.0, timing.finished - timing.first_token))
        for name, (start, end) in (stages or {}).items():
            s.stage_observe(name)(max(0.0, end - start))
        if usage is not None:
            s.prompt_tokens.inc(usage.prompt_tokens)
            s.generation_tokens.inc(usage.completion_tokens)
            if usage.cached_tokens:
                s.prefix_hits.inc(usage.cached_tokens)

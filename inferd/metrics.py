"""Every Prometheus series inferd exports, declared once, here.

Each `Metrics` owns its own CollectorRegistry (never the global one), so a test can build as many
apps as it likes and read exact values. The daemon makes one per process and hangs it on
ServerState; request handlers reach it as `state.metrics`.

Labels come from bounded sets only: `model` is a served model name that is loaded right now
(anything else is "other"), `version` and `backend` come from that engine's EngineInfo, so a sim
engine is always visible as backend="sim". Engine gauges are read from engine.stats() at scrape
time by a custom collector, so they are never stale and cost nothing between scrapes.

Hot path: a request gets a `RequestObservation` with pre-bound label children; inter-token
latency is observed once per delta the client receives (the gap divided by the delta's token
count), not once per token: a histogram observe costs ~2 us, which at 85k tokens/s would be a
fifth of a core, while deltas are coalesced to what the client can take. Even once per frame that
was a fifth of the SSE writer's CPU, so those observations are counted into plain per-bucket
integers on the loop thread (`_LoopHistogram`) and folded into the Prometheus histogram when
/metrics renders.
"""
from __future__ import annotations

import platform
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from inferd import __version__

if TYPE_CHECKING:
    from inferd.engine.base import Engine
    from inferd.types import EngineTiming, Usage

# `*_created` timestamps double the exposition size and no dashboard reads them.
disable_created_metrics()

OTHER = "other"
MODEL_LABELS = ("model", "version", "backend")

# Bucket edges in seconds, from a cached prefill on a GPU to a long generation on a CPU engine.
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
               0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0,
                 80.0, 160.0, 320.0, 640.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0)


class _LoopHistogram:
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
    def for_child(cls, child: Any) -> _LoopHistogram | None:
        if all(hasattr(child, a) for a in ("_upper_bounds", "_buckets", "_sum")):
            return cls(child)
        return None

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1    # the first bucket with amount <= bound
        self._sum += amount
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

    __slots__ = ("engine", "labels", "ttft", "itl", "itl_observe", "queue_wait", "e2e", "prompt_tokens",
                 "generation_tokens", "prefix_hits", "step", "_metrics")

    def __init__(self, metrics: Metrics, engine: Engine | None, labels: tuple[str, str, str]) -> None:
        self.engine = engine
        self.labels = labels
        self._metrics = metrics
        self.ttft = metrics.time_to_first_token.labels(*labels)
        self.itl = metrics.inter_token_latency.labels(*labels)
        self.itl_observe = metrics.loop_observer(self.itl)   # per frame: loop thread only
        self.queue_wait = metrics.queue_wait.labels(*labels)
        self.e2e = metrics.e2e_request_latency.labels(*labels)
        self.prompt_tokens = metrics.prompt_tokens.labels(*labels)
        self.generation_tokens = metrics.generation_tokens.labels(*labels)
        self.prefix_hits = metrics.prefix_cache_hit_tokens.labels(*labels)
        self.step = metrics.engine_step.labels(*labels)

    def count_request(self, status: int | str) -> None:
        self._metrics.requests_total.labels(*self.labels, str(status)).inc()

    def observe_step(self, seconds: float) -> None:
        """One engine step took `seconds`. Thread-safe: engines may call it from their step thread."""
        self.step.observe(seconds)


class RequestObservation:
    """Timing of one request as the client sees it. Create at arrival; feed deltas; finish once."""

    __slots__ = ("series", "arrival", "_last_token", "ttft", "_finished")

    def __init__(self, series: ModelSeries, arrival: float | None = None) -> None:
        self.series = series
        self.arrival = time.monotonic() if arrival is None else arrival
        self._last_token: float | None = None
        self.ttft: float | None = None
        self._finished = False

    def on_tokens(self, n_tokens: int, now: float | None = None) -> None:
        """The client was just sent a delta carrying `n_tokens` new tokens."""
        if n_tokens <= 0:
            return
        now = time.monotonic() if now is None else now
        if self._last_token is None:
            self.ttft = now - self.arrival
            self.series.ttft.observe(self.ttft)
            n_tokens -= 1  # the first token's latency is TTFT; the rest of the delta arrived with it
            if n_tokens:
                self.series.itl_observe(0.0)
        else:
            self.series.itl_observe((now - self._last_token) / n_tokens)
        self._last_token = now

    def finish(self, status: int | str, *, usage: Usage | None = None, timing: EngineTiming | None = None,
               now: float | None = None) -> None:
        """Count the request and record e2e latency, queue wait and token counters. Idempotent."""
        if self._finished:
            return
        self._finished = True
        now = time.monotonic() if now is None else now
        s = self.series
        s.count_request(status)
        s.e2e.observe(now - self.arrival)
        if self._last_token is None and timing is not None and timing.first_token is not None:
            # Nothing was streamed (a non-streaming response): the engine's stamps stand in for
            # when tokens would have reached a streaming client; one mean ITL observation.
            self.ttft = max(0.0, timing.first_token - self.arrival)
            s.ttft.observe(self.ttft)
            tokens = usage.completion_tokens if usage is not None else 0
            if tokens > 1 and timing.finished is not None:
                s.itl.observe(max(0.0, timing.finished - timing.first_token) / (tokens - 1))
        if timing is not None and timing.first_scheduled is not None:
            s.queue_wait.observe(max(0.0, timing.first_scheduled - self.arrival))
        if usage is not None:
            s.prompt_tokens.inc(usage.prompt_tokens)
            s.generation_tokens.inc(usage.completion_tokens)
            if usage.cached_tokens:
                s.prefix_hits.inc(usage.cached_tokens)


class _EngineCollector:
    """Scrape-time gauges from engine.stats(): never stale, nothing to update between scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # dynamic: the registry must not cache our names at registration

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("inferd_requests_running", "Requests in an engine's running batch",
                                    labels=MODEL_LABELS)
        waiting = GaugeMetricFamily("inferd_requests_waiting", "Requests inside an engine not yet scheduled",
                                    labels=MODEL_LABELS)
        blocks = GaugeMetricFamily("inferd_kv_cache_blocks", "KV cache blocks by state",
                                   labels=(*MODEL_LABELS, "state"))
        info = GaugeMetricFamily("inferd_model_info", "Loaded models (value 1); simulated=true for sim engines",
                                 labels=(*MODEL_LABELS, "simulated", "max_model_len"))
        for name, engine in self._metrics.engines().items():
            labels = self._metrics.labels_for(name)
            try:
                stats = engine.stats()
            except Exception:  # a failing engine must not break the scrape of the others
                continue
            running.add_metric(labels, stats.running)
            waiting.add_metric(labels, stats.waiting)
            blocks.add_metric((*labels, "used"), stats.kv_blocks_used)
            blocks.add_metric((*labels, "free"), stats.kv_blocks_total - stats.kv_blocks_used)
            info.add_metric((*labels, str(engine.info.simulated).lower(), str(engine.info.max_model_len)), 1)
        yield from (running, waiting, blocks, info)


class _LogCollector:
    """inferd_log_lines_dropped_total, read from inferd.log at scrape time."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from inferd.log import dropped_lines

        yield CounterMetricFamily("inferd_log_lines_dropped", "Log lines dropped because the log writer "
                                  "fell behind (stderr stalled); logging never blocks", value=dropped_lines())


class _TenancyCollector:
    """Scrape-time per-tenant and per-queue series from Tenancy.metrics_snapshot() (quota and admission
    keep cumulative tallies; summing them here costs nothing between scrapes). Tenant labels are already
    bounded there: configured tenants and `local`, everything else `other`."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        tenancy = self._metrics.tenancy()
        if tenancy is None:
            return
        snap = tenancy.metrics_snapshot()
        T, Q = ("tenant",), ("model", "version")
        rejections = CounterMetricFamily("inferd_tenant_rejections", "Requests refused, by tenant and reason "
                                         "(quota_rpm, quota_tpm, concurrency, queue_full, node_full, deadline, "
                                         "ttl, draining, limit, model_not_allowed)", labels=(*T, "reason"))
        admitted = CounterMetricFamily("inferd_tenant_admitted", "Requests released to an engine", labels=T)
        prompt = CounterMetricFamily("inferd_tenant_prompt_tokens", "Prompt tokens of admitted requests", labels=T)
        output = CounterMetricFamily("inferd_tenant_generation_tokens", "Tokens generated", labels=T)
        wait = SummaryMetricFamily("inferd_admission_queue_wait_seconds",
                                   "Time from entering the admission queue to release to the engine", labels=T)
        ttft = SummaryMetricFamily("inferd_tenant_time_to_first_token_seconds",
                                   "Admission queue entry to first token", labels=T)
        queued = GaugeMetricFamily("inferd_tenant_queued_requests", "Requests waiting in admission", labels=T)
        queued_tok = GaugeMetricFamily("inferd_tenant_queued_tokens",
                                       "Prompt + max_tokens of requests waiting in admission", labels=T)
        in_flight = GaugeMetricFamily("inferd_tenant_in_flight_requests",
                                      "Requests holding a concurrency slot (queued + running)", labels=T)
        remaining = GaugeMetricFamily("inferd_tenant_ratelimit_remaining",
                                      "Room left in the tenant's rate-limit bucket", labels=(*T, "limit"))
        vtc = GaugeMetricFamily("inferd_tenant_vtc", "Virtual token counter (weighted served cost) per queue",
                                labels=(*Q, *T))
        class_queued = GaugeMetricFamily("inferd_admission_queued_requests", "Requests waiting, by class",
                                         labels=(*Q, "class"))
        class_tokens = GaugeMetricFamily("inferd_admission_queued_tokens", "Tokens waiting, by class",
                                         labels=(*Q, "class"))
        running = GaugeMetricFamily("inferd_admission_running_requests", "Requests admission released that "
                                    "have not finished", labels=Q)
        throughput = GaugeMetricFamily("inferd_admission_throughput_cost_per_second",
                                       "Measured served cost per second (drives Retry-After and early refusal)",
                                       labels=Q)
        rows: dict[str, dict[str, float]] = {}
        refused: dict[tuple[str, str], int] = {}

        def add(label: str, **values: float) -> None:
            row = rows.setdefault(label, {})
            for k, v in values.items():
                row[k] = row.get(k, 0) + v

        def refuse(label: str, reasons: dict[str, int]) -> None:
            for reason, n in reasons.items():
                refused[(label, reason)] = refused.get((label, reason), 0) + n

        for label, row in snap["quota"].items():
            refuse(label, row["rejections"])
            add(label, in_flight=row["in_flight"])
            for kind in ("requests", "tokens"):
                level = row[f"remaining_{kind}"]
                if level is not None:
                    remaining.add_metric((label, kind), level)
        for label, reasons in snap["rejections"].items():
            refuse(label, reasons)
        for model, version, q in snap["queues"]:
            for label, row in q["tenants"].items():
                refuse(label, row["rejections"])
                add(label, admitted=row["admitted"], prompt=row["prompt_tokens"], output=row["output_tokens"],
                    wait_sum=row["queue_wait_sum_s"], wait_n=row["queue_wait_count"], ttft_sum=row["ttft_sum_s"],
                    ttft_n=row["ttft_count"], queued=row["queued"], queued_tokens=row["queued_tokens"])
                vtc.add_metric((model, version, label), row["vtc"])
            for cls, row in q["classes"].items():
                class_queued.add_metric((model, version, cls), row["queued"])
                class_tokens.add_metric((model, version, cls), row["queued_tokens"])
            running.add_metric((model, version), q["running"])
            if q["throughput_cost_per_s"] is not None:
                throughput.add_metric((model, version), q["throughput_cost_per_s"])
        for (label, reason), n in refused.items():
            rejections.add_metric((label, reason), n)
        for label, row in rows.items():
            admitted.add_metric((label,), row.get("admitted", 0))
            prompt.add_metric((label,), row.get("prompt", 0))
            output.add_metric((label,), row.get("output", 0))
            wait.add_metric((label,), row.get("wait_n", 0), row.get("wait_sum", 0.0))
            ttft.add_metric((label,), row.get("ttft_n", 0), row.get("ttft_sum", 0.0))
            queued.add_metric((label,), row.get("queued", 0))
            queued_tok.add_metric((label,), row.get("queued_tokens", 0))
            in_flight.add_metric((label,), row.get("in_flight", 0))
        yield from (rejections, admitted, prompt, output, wait, ttft, queued, queued_tok, in_flight, remaining,
                    vtc, class_queued, class_tokens, running, throughput)


class Metrics:
    """All of inferd's series in one registry. `engines` returns the loaded engines by served name."""

    def __init__(self, engines: Callable[[], Mapping[str, Engine]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engines: Callable[[], Mapping[str, Engine]] = engines or dict
        r = self.registry
        self.requests_total = Counter(
            "inferd_requests", "Requests answered, by HTTP status", (*MODEL_LABELS, "status"), registry=r)
        self.time_to_first_token = Histogram(
            "inferd_time_to_first_token_seconds", "Arrival to first token sent",
            MODEL_LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "inferd_inter_token_latency_seconds", "Time between tokens sent (one observation per delta)",
            MODEL_LABELS, buckets=ITL_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "inferd_queue_wait_seconds", "Arrival to first engine step (admission + engine queue)",
            MODEL_LABELS, buckets=QUEUE_BUCKETS, registry=r)
        self.e2e_request_latency = Histogram(
            "inferd_e2e_request_latency_seconds", "Arrival to last byte of the response",
            MODEL_LABELS, buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "inferd_prompt_tokens", "Prompt tokens of finished requests", MODEL_LABELS, registry=r)
        self.generation_tokens = Counter(
            "inferd_generation_tokens", "Generated tokens of finished requests", MODEL_LABELS, registry=r)
        self.prefix_cache_hit_tokens = Counter(
            "inferd_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
            MODEL_LABELS, registry=r)
        self.engine_step = Histogram(
            "inferd_engine_step_seconds", "Wall time of one engine step", MODEL_LABELS,
            buckets=STEP_BUCKETS, registry=r)
        self.config_reload_total = Counter(
            "inferd_config_reload", "Config reloads (SIGHUP), by result", ("result",), registry=r)
        for result in ("success", "error"):
            self.config_reload_total.labels(result)
        self.build_info = Gauge(
            "inferd_build_info", "inferd build (value 1)", ("version", "python"), registry=r)
        self.build_info.labels(__version__, platform.python_version()).set(1)
        r.register(_EngineCollector(self))
        r.register(_LogCollector())
        # Issue 4, per tenant (docs/tenants.md). Requests by status are counted as they end; the rest
        # is read from the tenancy's snapshots at scrape time (_TenancyCollector): no per-token cost.
        self.tenant_requests_total = Counter(
            "inferd_tenant_requests", "Inference requests answered, by tenant and HTTP status",
            ("tenant", "status"), registry=r)
        self.tenancy: Callable[[], Any] = lambda: None
        r.register(_TenancyCollector(self))
        self._loop_histograms: dict[int, _LoopHistogram] = {}   # by id(child); children live as long
        self._series: dict[tuple[str, str], ModelSeries] = {}   # by (model, version)
        self._other = ModelSeries(self, None, (OTHER, OTHER, OTHER))

    def labels_for(self, model: str, engine: Engine | None = None) -> tuple[str, str, str]:
        return self.series(model, engine).labels

    def series(self, model: str, engine: Engine | None = None) -> ModelSeries:
        """The bound series of the engine version serving `model`: `engine` when given (the loaded
        version that routing picked for a request, e.g. `model@v2`), else the model's default engine;
        `other` for a name that is not loaded. Labels stay bounded: callers pass only loaded engines,
        so there is one series per model version loaded."""
        if engine is None:
            engine = self.engines().get(model)
            if engine is None:
                return self._other
        info = engine.info
        key = (model, info.version)
        cached = self._series.get(key)
        if cached is not None and cached.engine is engine:
            return cached
        # a new engine for this version (first use, or reloaded): rebind
        cached = ModelSeries(self, engine, (model, info.version, info.backend))
        self._series[key] = cached
        return cached

    def start_request(self, model: str, arrival: float | None = None,
                      engine: Engine | None = None) -> RequestObservation:
        return RequestObservation(self.series(model, engine), arrival)

    def count_rejected(self, model: str, status: int | str, engine: Engine | None = None) -> None:
        """A request answered without running (4xx/5xx before the engine): count it only."""
        self.series(model, engine).count_request(status)

    def step_observer(self, model: str, engine: Engine | None = None) -> Callable[[float], None]:
        """Feeds inferd_engine_step_seconds of `engine` (a loaded version of `model`; default: its
        default engine, looked up now)."""
        return self.series(model, engine).observe_step

    def config_reloaded(self, ok: bool) -> None:
        self.config_reload_total.labels("success" if ok else "error").inc()

    def watch_tenancy(self, source: Callable[[], Any]) -> None:
        """`source()` returns the live inferd.tenancy.Tenancy (or None); read at every scrape."""
        self.tenancy = source

    def count_tenant_request(self, tenant_label: str, status: int | str) -> None:
        self.tenant_requests_total.labels(tenant_label, str(status)).inc()

    def loop_observer(self, child: Any) -> Callable[[float], None]:
        """A cheap observe() for a histogram child, for the event-loop thread only (see _LoopHistogram)."""
        hist = self._loop_histograms.get(id(child))
        if hist is None:
            hist = _LoopHistogram.for_child(child)
            if hist is None:
                return child.observe
            self._loop_histograms[id(child)] = hist
        return hist.observe

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its Content-Type, for the /metrics handler (on the event loop)."""
        for hist in self._loop_histograms.values():
            hist.fold()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def observe_request(metrics: Metrics, model: str, status: int | str, *, ttft: float | None,
                    itl: list[float] | tuple[float, ...] = (), queue_wait: float | None, e2e: float,
                    usage: Usage | None = None) -> None:
    """Record a whole request at once, from durations the caller measured (tests, batch paths)."""
    s = metrics.series(model)
    s.count_request(status)
    if ttft is not None:
        s.ttft.observe(ttft)
    for gap in itl:
        s.itl.observe(gap)
    if queue_wait is not None:
        s.queue_wait.observe(queue_wait)
    s.e2e.observe(e2e)
    if usage is not None:
        s.prompt_tokens.inc(usage.prompt_tokens)
        s.generation_tokens.inc(usage.completion_tokens)
        s.prefix_hits.inc(usage.cached_tokens)


__all__ = ["Metrics", "ModelSeries", "RequestObservation", "observe_request", "OTHER", "CONTENT_TYPE_LATEST"]

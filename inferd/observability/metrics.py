"""Every Prometheus series inferd exports, declared once: here, in request_metrics and in tenant_metrics.

Each `Metrics` owns its own CollectorRegistry (never the global one), so a test can build as many
apps as it likes and read exact values. The daemon makes one per process and hangs it on
ServerState; request handlers reach it as `state.metrics`.

Labels come from bounded sets only: `model` is a served model name that is loaded right now
(anything else is "other"), `version` and `backend` come from that engine's EngineInfo, so a sim
engine is always visible as backend="sim". Engine gauges are read from engine.stats() at scrape
time by a custom collector (inferd.observability.engine_metrics), so they are never stale and cost
nothing between scrapes.

Per-tenant and admission series: `inferd.observability.tenant_metrics` (read from the tenancy at scrape time).
The hot path, a request's observation through pre-bound label children: `inferd.observability.request_metrics`.
"""
from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from inferd import __version__
from inferd.observability.breaker_metrics import BreakerCollector
from inferd.observability.memory_budget_metrics import LifecycleCollector
from inferd.observability.embedding_metrics import EmbeddingMetrics
from inferd.observability.engine_metrics import MODEL_LABELS, EngineCollector
from inferd.observability.cluster_metrics import ClusterCollector
from inferd.observability.garbage import GcCollector, watch_collections
from inferd.observability.request_metrics import LoopHistogram, ModelSeries, RequestObservation
from inferd.observability.slo_metrics import SloCollector
from inferd.observability.store_metrics import StoreCollector
from inferd.observability.tenant_metrics import TenancyCollector
from inferd.observability.tenant_view import TenantView

if TYPE_CHECKING:
    from inferd.engine import Engine
    from inferd.types import Usage

# `*_created` timestamps double the exposition size and no dashboard reads them.
disable_created_metrics()

OTHER = "other"
# Why the listener closed a connection itself (inferd.daemon.listener): a bounded set, all pre-created.
CONNECTION_CUT_REASONS = ("header_timeout", "body_timeout", "idle", "over_cap")

# Bucket edges in seconds, from a cached prefill on a GPU to a long generation on a CPU engine.
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
               0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0,
                 80.0, 160.0, 320.0, 640.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
WRITE_DELAY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05,
                       0.1, 0.25, 0.5, 1.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0)


class _LogCollector:
    """inferd_log_lines_dropped_total, read from inferd.observability.log at scrape time."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from inferd.observability.log import dropped_lines

        yield CounterMetricFamily("inferd_log_lines_dropped", "Log lines dropped because the log writer "
                                  "fell behind (stderr stalled); logging never blocks", value=dropped_lines())


class Metrics:
    """All of inferd's series in one registry. `engines` returns the loaded engines by served name."""

    def __init__(self, engines: Callable[[], Mapping[str, Engine]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engines: Callable[[], Mapping[str, Engine]] = engines or dict
        # The order of these calls is the order of the exposition: keep it.
        self._declare_model_series(self.registry)
        self._declare_process_series(self.registry)
        self._declare_subsystem_series(self.registry)
        self._declare_cache_and_policy_series(self.registry)
        self._declare_usage_series(self.registry)
        self._declare_listener_series(self.registry)
        self._loop_histograms: dict[int, LoopHistogram] = {}   # by id(child); children live as long
        self._series: dict[tuple[str, str], ModelSeries] = {}   # by (model, version)
        self._other = ModelSeries(self, None, (OTHER, OTHER, OTHER))

    def _declare_model_series(self, r: CollectorRegistry) -> None:
        """Per loaded model version (MODEL_LABELS), bound per engine by ModelSeries: requests by status,
        the latency of each stage, tokens, engine steps and the embedding batcher."""
        self.requests_total = Counter(
            "inferd_requests", "Requests answered, by HTTP status", (*MODEL_LABELS, "status"), registry=r)
        self.time_to_first_token = Histogram(
            "inferd_time_to_first_token_seconds", "Arrival to first token sent",
            MODEL_LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "inferd_inter_token_latency_seconds", "Time between tokens sent (one observation per delta)",
            MODEL_LABELS, buckets=ITL_BUCKETS, registry=r)
        self.stream_write_delay = Histogram(
            "inferd_stream_write_delay_seconds", "From the engine pushing a stream's oldest unsent token to "
            "the frame carrying it being written (the latency the front adds; one observation per frame)",
            MODEL_LABELS, buckets=WRITE_DELAY_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "inferd_queue_wait_seconds", "Arrival to first engine step (admission + engine queue)",
            MODEL_LABELS, buckets=QUEUE_BUCKETS, registry=r)
        self.request_stage = Histogram(
            "inferd_request_stage_seconds", "Time in each stage of a request, the stages of its Server-Timing "
            "header and trace spans: api (every check before admission), queue (the fair admission queue), "
            "engine_queue, prefill, decode, write (the engine's last token to the response written)",
            (*MODEL_LABELS, "stage"), buckets=QUEUE_BUCKETS, registry=r)
        # The engine's phases alone, per request (the stage histogram above has them too).
        self.prefill_time = Histogram(
            "inferd_prefill_seconds", "First engine step to first token (the prompt's prefill)",
            MODEL_LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.decode_time = Histogram(
            "inferd_decode_seconds", "First token to the engine's last (the decode phase)",
            MODEL_LABELS, buckets=E2E_BUCKETS, registry=r)
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
        self.embeddings = EmbeddingMetrics(r, MODEL_LABELS)      # the embedding (unary) batcher

    def _declare_process_series(self, r: CollectorRegistry) -> None:
        """The process: config reloads, the build, engines' gauges, dropped log lines and the garbage
        collector's pauses (all three read at scrape time)."""
        self.config_reload_total = Counter(
            "inferd_config_reload", "Config reloads (SIGHUP), by result", ("result",), registry=r)
        for result in ("success", "error"):
            self.config_reload_total.labels(result)
        self.build_info = Gauge(
            "inferd_build_info", "inferd build (value 1)", ("version", "python"), registry=r)
        self.build_info.labels(__version__, platform.python_version()).set(1)
        r.register(EngineCollector(lambda: self.engines(), self.labels_for))
        r.register(_LogCollector())
        watch_collections()
        r.register(GcCollector())

    def _declare_subsystem_series(self, r: CollectorRegistry) -> None:
        """Per tenant and per subsystem (tenancy, cluster, store, SLOs, breakers, model lifecycle), read
        from the subsystem at scrape time: each source answers None until its watch_* method sets it."""
        # Per tenant (docs/tenants.md). Requests by status are counted as they end; the rest
        # is read from the tenancy's snapshots at scrape time (TenancyCollector): no per-token cost.
        self.tenant_requests_total = Counter(
            "inferd_tenant_requests", "Inference requests answered, by tenant and HTTP status",
            ("tenant", "status"), registry=r)
        self._tenant_requests: dict[tuple[str, int | str], Any] = {}
        self.tenancy: Callable[[], Any] = lambda: None
        r.register(TenancyCollector(lambda: self.tenancy()))   # late-bound: watch_tenancy swaps it
        self.cluster: Callable[[], Any] = lambda: None
        r.register(ClusterCollector(lambda: self.cluster()))   # set by watch_cluster
        # The durable store (queue depth, commits, rows) at scrape time; spend as rows commit.
        self.store: Callable[[], Any] = lambda: None
        r.register(StoreCollector(lambda: self.store()))
        # SLO events, burn rates and budgets, from the node's SloTracker at scrape time.
        self.slos: Callable[[], Any] = lambda: None
        r.register(SloCollector(lambda: (tracker.snapshot() if (tracker := self.slos()) is not None else ())))
        self.breakers: Callable[[], Any] = lambda: None
        r.register(BreakerCollector(lambda: (b.snapshot() if (b := self.breakers()) is not None else ())))
        self.lifecycle: Callable[[], Any] = lambda: None
        r.register(LifecycleCollector(lambda: self.lifecycle()))     # set by watch_lifecycle

    def _declare_cache_and_policy_series(self, r: CollectorRegistry) -> None:
        """What the response cache, the safety policies and overload degradation did to requests."""
        self.cache_lookups_total = Counter(
            "inferd_response_cache_lookups", "Cacheable requests by what the response cache did (hit, miss, "
            "refresh: Cache-Control no-cache)", ("result",), registry=r)
        for result in ("hit", "miss", "refresh"):
            self.cache_lookups_total.labels(result)
        self.cache_bytes = Gauge("inferd_response_cache_bytes", "Bytes the response cache holds", registry=r)
        self.cache_entries = Gauge("inferd_response_cache_entries", "Generations the response cache holds",
                                   registry=r)
        self.cache_evictions = Gauge("inferd_response_cache_evictions", "Entries evicted for room since start "
                                     "(a gauge read from the cache)", registry=r)
        self.safety_actions_total = Counter(
            "inferd_safety_actions", "Requests a safety policy acted on: refused (stage=input) or stopped "
            "(stage=output)", ("tenant", "policy", "stage"), registry=r)
        self.degraded_total = Counter(
            "inferd_degraded_requests", "Requests degraded under overload ([degrade.*]), by route and action "
            "(max_tokens: capped; route: sent to another model)", ("route", "action"), registry=r)

    def _declare_usage_series(self, r: CollectorRegistry) -> None:
        """Recording usage: ledger rows lost, spend per tenant and per model version, batch lines and
        batches."""
        self.ledger_errors_total = Counter(
            "inferd_ledger_errors", "Usage rows that could not be recorded (the store failed)", registry=r)
        self.tenant_spend_total = Counter(
            "inferd_tenant_spend", "Cost of recorded requests, per tenant (the currency of [prices])",
            ("tenant",), registry=r)
        self.spend_total = Counter(
            "inferd_spend", "Cost of recorded requests, per model version", ("model", "version"), registry=r)
        self.batch_lines_total = Counter(
            "inferd_batch_lines", "Batch API lines this node ran, by result (ok: in the output file, error: in "
            "the error file)", ("result",), registry=r)
        self.batches_ended_total = Counter(
            "inferd_batches_ended", "Batches this node finished, by final status", ("status",), registry=r)
        for result in ("ok", "error"):
            self.batch_lines_total.labels(result)

    def _declare_listener_series(self, r: CollectorRegistry) -> None:
        """The HTTP listener (inferd.daemon.listener): connections it cut, requests its parser refused."""
        self.connections_cut_total = Counter(
            "inferd_http_connections_cut", "Connections the listener closed or refused, by reason",
            ("reason",), registry=r)
        for reason in CONNECTION_CUT_REASONS:
            self.connections_cut_total.labels(reason)
        self.protocol_errors_total = Counter(
            "inferd_http_protocol_errors", "Requests the HTTP parser refused (answered 4xx), by kind",
            ("reason",), registry=r)
        self.connections_open = Gauge(
            "inferd_http_connections_open", "Open client connections (serving and probe-only)", registry=r)

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
        if cached is not None and cached.serves(engine):
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

    def observe_engine(self, model: str, engine: Engine) -> None:
        """Bind a started engine's observers: its steps and, for a unary (embedding) engine, its batches."""
        series = self.series(model, engine)
        engine.step_observer = series.observe_step
        if hasattr(engine, "batch_observer"):
            engine.batch_observer, engine.deadline_drop_observer = self.embeddings.observers(series.labels)

    def config_reloaded(self, ok: bool) -> None:
        self.config_reload_total.labels("success" if ok else "error").inc()

    def watch_store(self, source: Callable[[], Any]) -> None:
        """`source()` returns the open inferd.store.Database (or None); read at every scrape."""
        self.store = source

    def count_batch_line(self, ok: bool) -> None:
        self.batch_lines_total.labels("ok" if ok else "error").inc()

    def count_batch_end(self, status: str) -> None:
        """`status`: a batch's final state (completed, failed, expired, cancelled): a bounded set."""
        self.batches_ended_total.labels(status).inc()

    def count_ledger_error(self) -> None:
        self.ledger_errors_total.inc()

    def count_spend(self, tenant_label: str, model: str, version: str, cost: float) -> None:
        """`model` and `version` come from a loaded engine, `tenant_label` from the bounded tenant labels."""
        self.tenant_spend_total.labels(tenant_label).inc(cost)
        self.spend_total.labels(model, version).inc(cost)

    def watch_slos(self, source: Callable[[], Any]) -> None:
        """`source()` returns the live inferd.slo.SloTracker (or None); read at every scrape."""
        self.slos = source

    def watch_breakers(self, source: Callable[[], Any]) -> None:
        """`source()` returns the control plane's inferd.models.Breakers (or None); read at every scrape."""
        self.breakers = source

    def watch_lifecycle(self, source: Callable[[], Any]) -> None:
        """`source()` returns the daemon's inferd.models.ModelLifecycle (or None); read at every scrape."""
        self.lifecycle = source

    def count_cache_lookup(self, result: str) -> None:
        self.cache_lookups_total.labels(result).inc()

    def watch_response_cache(self, source: Callable[[], Any]) -> None:
        """`source()` is the node's inferd.cache.ResponseCache; read at scrape time."""
        self.cache_bytes.set_function(lambda: source().bytes)
        self.cache_entries.set_function(lambda: len(source()))
        self.cache_evictions.set_function(lambda: source().evictions)

    def count_safety_action(self, tenant_label: str, policy: str, stage: str) -> None:
        """`policy`: a configured [policies.<name>]; `stage`: "input" or "output"."""
        self.safety_actions_total.labels(tenant_label, policy, stage).inc()

    def count_degraded(self, route: str, action: str) -> None:
        """`route`: a configured [degrade.<route>] name; `action`: "max_tokens" or "route"."""
        self.degraded_total.labels(route, action).inc()

    def watch_cluster(self, source: Callable[[], Any]) -> None:
        """`source()` returns the live inferd.cluster.Cluster (or None); read at every scrape."""
        self.cluster = source

    def watch_tenancy(self, source: Callable[[], Any]) -> None:
        """`source()` returns the live inferd.tenancy.tenancy.Tenancy (or None); read at every scrape."""
        self.tenancy = source

    def count_tenant_request(self, tenant_label: str, status: int | str) -> None:
        key = (tenant_label, status)
        child = self._tenant_requests.get(key)
        if child is None:      # `.labels()` validates and locks on every call: once per (bounded) label pair
            child = self._tenant_requests[key] = self.tenant_requests_total.labels(tenant_label, str(status))
        child.inc()

    def count_connection_cut(self, reason: str) -> None:
        """`reason`: one of CONNECTION_CUT_REASONS."""
        self.connections_cut_total.labels(reason).inc()

    def count_protocol_error(self, reason: str) -> None:
        """`reason`: a kind from inferd.api.errors' fixed table of parser refusals."""
        self.protocol_errors_total.labels(reason).inc()

    def watch_connections(self, source: Callable[[], int]) -> None:
        """`source()` is the listener's open-connection count, read at scrape time."""
        self.connections_open.set_function(source)

    def loop_observer(self, child: Any) -> Callable[[float], None]:
        """A cheap observe() for a histogram child, for the event-loop thread only (see LoopHistogram)."""
        hist = self.loop_histogram(child)
        return child.observe if hist is None else hist.observe

    def loop_histogram(self, child: Any) -> LoopHistogram | None:
        """The event-loop thread's LoopHistogram of a histogram child (None: its layout is not one it reads)."""
        hist = self._loop_histograms.get(id(child))
        if hist is None:
            hist = LoopHistogram.for_child(child)
            if hist is not None:
                self._loop_histograms[id(child)] = hist
        return hist

    def render(self, *, every_tenant: bool = True, tenant: str | None = None) -> tuple[bytes, str]:
        """The exposition body and its Content-Type, for the /metrics handler (on the event loop). Unless
        `every_tenant`, only `tenant`'s per-tenant series are in it (inferd.observability.tenant_view)."""
        for hist in self._loop_histograms.values():
            hist.fold()
        source = self.registry if every_tenant else TenantView(self.registry, tenant)
        return generate_latest(source), CONTENT_TYPE_LATEST     # type: ignore[arg-type]


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

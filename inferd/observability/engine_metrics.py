"""The engines' series, built at scrape time from each loaded engine's stats(): never stale, free between scrapes.

Registered by inferd.observability.metrics.Metrics, which passes the loaded engines and their labels.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from inferd.engine import Engine, SpeculationStats

MODEL_LABELS = ("model", "version", "backend")


class EngineCollector:
    """Scrape-time gauges from engine.stats(): never stale, nothing to update between scrapes."""

    def __init__(self, engines: Callable[[], Mapping[str, Engine]],
                 labels_for: Callable[[str], tuple[str, str, str]]) -> None:
        """`engines()`: the loaded engines by served name; `labels_for(name)`: their MODEL_LABELS values."""
        self._engines = engines
        self._labels_for = labels_for

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
        # The engine's own counts, as its steps make them (inferd_generation_tokens_total counts finished
        # requests): what the engine produced, to compare with what clients received (bench/node.py).
        steps = CounterMetricFamily("inferd_engine_steps", "Engine steps run", labels=MODEL_LABELS)
        generated = CounterMetricFamily("inferd_engine_generated_tokens", "Tokens the engine generated, as its "
                                        "steps produced them", labels=MODEL_LABELS)
        step_cpu = CounterMetricFamily("inferd_engine_step_cpu_seconds", "Host CPU the engine's step loop used "
                                       "(sim: its turns on the event loop; reference, torch: the step thread)",
                                       labels=MODEL_LABELS)
        yielded = CounterMetricFamily("inferd_engine_fairness_preemptions", "Sequences preempted to give their "
                                      "slot to a tenant under its share (recomputed later)", labels=MODEL_LABELS)
        # What to autoscale on (docs/slos.md), labelled with the hardware to add more of.
        scale_labels = (*MODEL_LABELS, "hardware")
        fill = GaugeMetricFamily("inferd_engine_batch_fill_ratio", "Running sequences / max_batch_size",
                                 labels=scale_labels)
        kv = GaugeMetricFamily("inferd_engine_kv_usage_ratio", "KV cache blocks in use / all blocks",
                               labels=scale_labels)
        rate = GaugeMetricFamily("inferd_engine_tokens_per_second", "Tokens the engine computes per second "
                                 "(recent steps; sim engines: simulated seconds)", labels=scale_labels)
        speculation = SpeculationFamilies()
        for name, engine in self._engines().items():
            labels = self._labels_for(name)
            try:
                stats = engine.stats()
            except Exception:  # a failing engine must not break the scrape of the others
                continue
            running.add_metric(labels, stats.running)
            waiting.add_metric(labels, stats.waiting)
            blocks.add_metric((*labels, "used"), stats.kv_blocks_used)
            blocks.add_metric((*labels, "free"), stats.kv_blocks_total - stats.kv_blocks_used)
            info.add_metric((*labels, str(engine.info.simulated).lower(), str(engine.info.max_model_len)), 1)
            steps.add_metric(labels, stats.steps_total)
            generated.add_metric(labels, stats.generation_tokens_total)
            yielded.add_metric(labels, stats.fairness_preemptions_total)
            if stats.step_cpu_seconds_total is not None:
                step_cpu.add_metric(labels, stats.step_cpu_seconds_total)
            info_ = engine.info
            scale = (*labels, info_.hardware)
            fill.add_metric(scale, stats.running / info_.max_batch_size if info_.max_batch_size else 0.0)
            kv.add_metric(scale, stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0)
            rate.add_metric(scale, stats.tokens_per_s)
            if stats.speculation is not None:
                speculation.add(labels, stats.speculation)
        yield from (running, waiting, blocks, info, steps, generated, step_cpu, yielded, fill, kv, rate)
        yield from speculation.families()


class SpeculationFamilies:
    """Speculative decoding's series, for the engines that speculate (see docs/speculative.md)."""

    def __init__(self) -> None:
        self.drafted = CounterMetricFamily("inferd_spec_decode_draft_tokens", "Draft tokens verified by the "
                                           "model (speculative decoding)", labels=MODEL_LABELS)
        self.accepted = CounterMetricFamily("inferd_spec_decode_accepted_tokens", "Draft tokens the model kept",
                                            labels=MODEL_LABELS)
        self.wasted = CounterMetricFamily("inferd_spec_decode_wasted_tokens", "Draft tokens the model rejected "
                                          "(computed for nothing)", labels=MODEL_LABELS)
        self.verifications = CounterMetricFamily("inferd_spec_decode_verifications", "A sequence's steps with a "
                                                 "draft (each yields its kept drafts and one token of the "
                                                 "model's own)", labels=MODEL_LABELS)
        self.acceptance = GaugeMetricFamily("inferd_spec_decode_acceptance_ratio", "Accepted / draft tokens, "
                                            "since start", labels=MODEL_LABELS)
        self.per_step = GaugeMetricFamily("inferd_spec_decode_tokens_per_verification", "Tokens a sequence gets "
                                          "from a step with a draft, on average since start", labels=MODEL_LABELS)

    def add(self, labels: tuple[str, ...], s: SpeculationStats) -> None:
        self.drafted.add_metric(labels, s.draft_tokens)
        self.accepted.add_metric(labels, s.accepted_tokens)
        self.wasted.add_metric(labels, s.draft_tokens - s.accepted_tokens)
        self.verifications.add_metric(labels, s.verifications)
        self.acceptance.add_metric(labels, s.accepted_tokens / s.draft_tokens if s.draft_tokens else 0.0)
        self.per_step.add_metric(labels, (s.accepted_tokens + s.verifications) / s.verifications
                                 if s.verifications else 0.0)

    def families(self) -> tuple[Metric, ...]:
        return (self.drafted, self.accepted, self.wasted, self.verifications, self.acceptance, self.per_step)

from __future__ import annotations

import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferd.engine.base import EngineInfo, EngineStats
from inferd.metrics import OTHER, Metrics, observe_request
from inferd.types import EngineTiming, Usage


class StatsOnlyEngine:
    """What the metrics collector reads of an engine: `info` and `stats()`."""

    def __init__(self, backend: str = "sim", version: str = "v1", used: int = 10, running: int = 2,
                 waiting: int = 1, fail: bool = False) -> None:
        self.info = EngineInfo(backend=backend, model_name="m", version=version, max_model_len=4096,
                               block_size=16, num_kv_blocks=100, max_batch_size=8, max_num_tokens=256,
                               simulated=backend == "sim")
        self.used, self.running, self.waiting, self.fail = used, running, waiting, fail

    def stats(self) -> EngineStats:
        if self.fail:
            raise RuntimeError("engine is gone")
        return EngineStats(running=self.running, waiting=self.waiting, kv_blocks_total=100,
                           kv_blocks_used=self.used, prefix_cache_hit_rate=0.0, step_latency_s=0.01,
                           steps_total=1, prompt_tokens_total=0, generation_tokens_total=0,
                           prefix_cache_hit_tokens_total=0, tokens_per_s=0.0)


@pytest.fixture
def engines():
    return {"small": StatsOnlyEngine()}


@pytest.fixture
def metrics(engines):
    return Metrics(lambda: engines)


def scrape(metrics: Metrics) -> dict[str, list]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    families = text_string_to_metric_families(body.decode())
    return {f.name: f.samples for f in families}


def value(samples, name: str, **labels) -> float:
    matches = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (name, labels, samples)
    return matches[0]


SIM_LABELS = {"model": "small", "version": "v1", "backend": "sim"}


def test_every_series_is_declared_with_its_labels(metrics):
    families = scrape(metrics)
    for name in ("inferd_requests", "inferd_time_to_first_token_seconds", "inferd_inter_token_latency_seconds",
                 "inferd_queue_wait_seconds", "inferd_e2e_request_latency_seconds", "inferd_prompt_tokens",
                 "inferd_generation_tokens", "inferd_prefix_cache_hit_tokens", "inferd_requests_running",
                 "inferd_requests_waiting", "inferd_kv_cache_blocks", "inferd_engine_step_seconds",
                 "inferd_config_reload", "inferd_build_info", "inferd_model_info"):
        assert name in families, name
    assert value(families["inferd_config_reload"], "inferd_config_reload_total", result="success") == 0
    assert value(families["inferd_build_info"], "inferd_build_info") == 1


def test_two_instances_do_not_share_series():
    a, b = Metrics(), Metrics()
    a.count_rejected("x", 404)
    assert value(scrape(a)["inferd_requests"], "inferd_requests_total", status="404") == 1
    assert not scrape(b)["inferd_requests"]


def test_engine_gauges_are_read_at_scrape_time(metrics, engines):
    fams = scrape(metrics)
    assert value(fams["inferd_requests_running"], "inferd_requests_running", **SIM_LABELS) == 2
    assert value(fams["inferd_requests_waiting"], "inferd_requests_waiting", **SIM_LABELS) == 1
    assert value(fams["inferd_kv_cache_blocks"], "inferd_kv_cache_blocks", state="used", **SIM_LABELS) == 10
    assert value(fams["inferd_kv_cache_blocks"], "inferd_kv_cache_blocks", state="free", **SIM_LABELS) == 90
    engines["small"].used = 60
    fams = scrape(metrics)
    assert value(fams["inferd_kv_cache_blocks"], "inferd_kv_cache_blocks", state="free", **SIM_LABELS) == 40


def test_sim_engine_is_identifiable_in_labels(metrics):
    info = scrape(metrics)["inferd_model_info"]
    assert value(info, "inferd_model_info", simulated="true", **SIM_LABELS) == 1


def test_a_failing_engine_does_not_break_the_scrape(engines, metrics):
    engines["broken"] = StatsOnlyEngine(backend="reference", fail=True)
    fams = scrape(metrics)
    assert {s.labels["model"] for s in fams["inferd_requests_running"]} == {"small"}


def test_request_observation_records_ttft_itl_queue_wait_e2e_and_tokens(metrics):
    obs = metrics.start_request("small", arrival=100.0)
    obs.on_tokens(1, now=100.5)          # first token: TTFT 0.5
    obs.on_tokens(4, now=100.9)          # 4 tokens in 0.4 s: one ITL observation of 0.1
    obs.on_tokens(0, now=101.0)          # a delta without tokens (e.g. held-back stop text): nothing
    timing = EngineTiming(submitted=100.0, first_scheduled=100.25, first_token=100.5, finished=101.0)
    obs.finish(200, usage=Usage(prompt_tokens=7, completion_tokens=5, cached_tokens=3), timing=timing, now=102.0)
    obs.finish(200, now=103.0)           # idempotent
    f = scrape(metrics)
    assert value(f["inferd_requests"], "inferd_requests_total", status="200", **SIM_LABELS) == 1
    assert value(f["inferd_time_to_first_token_seconds"], "inferd_time_to_first_token_seconds_sum",
                 **SIM_LABELS) == pytest.approx(0.5)
    itl = f["inferd_inter_token_latency_seconds"]
    assert value(itl, "inferd_inter_token_latency_seconds_count", **SIM_LABELS) == 1
    assert value(itl, "inferd_inter_token_latency_seconds_sum", **SIM_LABELS) == pytest.approx(0.1)
    assert value(f["inferd_queue_wait_seconds"], "inferd_queue_wait_seconds_sum", **SIM_LABELS) == pytest.approx(0.25)
    assert value(f["inferd_e2e_request_latency_seconds"], "inferd_e2e_request_latency_seconds_sum",
                 **SIM_LABELS) == pytest.approx(2.0)
    assert value(f["inferd_prompt_tokens"], "inferd_prompt_tokens_total", **SIM_LABELS) == 7
    assert value(f["inferd_generation_tokens"], "inferd_generation_tokens_total", **SIM_LABELS) == 5
    assert value(f["inferd_prefix_cache_hit_tokens"], "inferd_prefix_cache_hit_tokens_total", **SIM_LABELS) == 3


def test_first_delta_with_several_tokens_counts_ttft_once():
    m = Metrics(lambda: {"small": StatsOnlyEngine()})
    obs = m.start_request("small", arrival=0.0)
    obs.on_tokens(3, now=1.0)
    f = scrape(m)
    assert value(f["inferd_time_to_first_token_seconds"], "inferd_time_to_first_token_seconds_count",
                 **SIM_LABELS) == 1
    assert value(f["inferd_inter_token_latency_seconds"], "inferd_inter_token_latency_seconds_sum",
                 **SIM_LABELS) == 0.0


def test_unknown_model_is_labelled_other(metrics):
    metrics.count_rejected("no-such-model", 404)
    f = scrape(metrics)
    assert value(f["inferd_requests"], "inferd_requests_total", model=OTHER, version=OTHER, status="404") == 1


def test_labels_follow_an_engine_swapped_under_the_same_name(metrics, engines):
    metrics.count_rejected("small", 200)
    engines["small"] = StatsOnlyEngine(version="v2")
    metrics.count_rejected("small", 200)
    f = scrape(metrics)["inferd_requests"]
    assert value(f, "inferd_requests_total", model="small", version="v1") == 1
    assert value(f, "inferd_requests_total", model="small", version="v2") == 1


def test_observe_request_helper_records_a_whole_request(metrics):
    observe_request(metrics, "small", 200, ttft=0.2, itl=[0.01, 0.03], queue_wait=0.05, e2e=1.0,
                    usage=Usage(prompt_tokens=3, completion_tokens=2))
    f = scrape(metrics)
    assert value(f["inferd_inter_token_latency_seconds"], "inferd_inter_token_latency_seconds_count",
                 **SIM_LABELS) == 2
    assert value(f["inferd_generation_tokens"], "inferd_generation_tokens_total", **SIM_LABELS) == 2


def test_step_observer_is_safe_from_an_engine_thread(metrics):
    observe = metrics.step_observer("small")
    threads = [threading.Thread(target=lambda: [observe(0.002) for _ in range(500)]) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f = scrape(metrics)["inferd_engine_step_seconds"]
    assert value(f, "inferd_engine_step_seconds_count", **SIM_LABELS) == 1000


def test_config_reload_counter(metrics):
    metrics.config_reloaded(True)
    metrics.config_reloaded(False)
    metrics.config_reloaded(False)
    f = scrape(metrics)["inferd_config_reload"]
    assert value(f, "inferd_config_reload_total", result="success") == 1
    assert value(f, "inferd_config_reload_total", result="error") == 2


def test_non_streamed_request_takes_ttft_and_mean_itl_from_engine_timing(metrics):
    obs = metrics.start_request("small", arrival=10.0)
    timing = EngineTiming(submitted=10.0, first_scheduled=10.1, first_token=10.3, finished=11.3)
    obs.finish(200, usage=Usage(prompt_tokens=4, completion_tokens=11), timing=timing, now=11.4)
    assert obs.ttft == pytest.approx(0.3)
    f = scrape(metrics)
    assert value(f["inferd_time_to_first_token_seconds"], "inferd_time_to_first_token_seconds_sum",
                 **SIM_LABELS) == pytest.approx(0.3)
    itl = f["inferd_inter_token_latency_seconds"]
    assert value(itl, "inferd_inter_token_latency_seconds_count", **SIM_LABELS) == 1
    assert value(itl, "inferd_inter_token_latency_seconds_sum", **SIM_LABELS) == pytest.approx(0.1)


def test_streamed_request_does_not_double_count_ttft_at_finish(metrics):
    obs = metrics.start_request("small", arrival=0.0)
    obs.on_tokens(1, now=0.5)
    obs.finish(200, usage=Usage(prompt_tokens=1, completion_tokens=1),
               timing=EngineTiming(submitted=0.0, first_token=0.4, finished=0.4), now=0.6)
    f = scrape(metrics)
    assert value(f["inferd_time_to_first_token_seconds"], "inferd_time_to_first_token_seconds_count",
                 **SIM_LABELS) == 1



def test_itl_counted_on_the_loop_lands_in_the_buckets_a_direct_observe_would(metrics):
    gaps = [0.0, 0.001, 0.0011, 0.004, 0.025, 0.0251, 9.99, 10.0, 42.0]   # on, between and past bucket edges
    for gap in gaps:
        metrics.series("small").itl_observe(gap)
    direct = Metrics(lambda: {"small": StatsOnlyEngine()})
    for gap in gaps:
        direct.series("small").itl.observe(gap)
    name = "inferd_inter_token_latency_seconds"
    got, want = scrape(metrics)[name], scrape(direct)[name]
    assert [(s.name, s.labels, s.value) for s in got if s.name != name + "_sum"] == \
        [(s.name, s.labels, s.value) for s in want if s.name != name + "_sum"]
    assert value(got, name + "_sum", **SIM_LABELS) == pytest.approx(sum(gaps))
    assert value(got, name + "_count", **SIM_LABELS) == len(gaps)
    assert scrape(metrics)[name] == got                     # a second render does not count them again


def test_a_request_served_by_another_loaded_version_is_labelled_with_that_version(metrics, engines):
    v2 = StatsOnlyEngine(version="v2")
    metrics.start_request("small", arrival=0.0, engine=v2).finish(200, now=1.0)
    metrics.start_request("small", arrival=0.0).finish(200, now=1.0)       # no engine: the default (v1)
    metrics.count_rejected("small", 429, v2)
    samples = scrape(metrics)["inferd_requests"]
    assert value(samples, "inferd_requests_total", status="200", **{**SIM_LABELS, "version": "v2"}) == 1
    assert value(samples, "inferd_requests_total", status="200", **SIM_LABELS) == 1
    assert value(samples, "inferd_requests_total", status="429", **{**SIM_LABELS, "version": "v2"}) == 1
    assert metrics.series("small", v2) is metrics.series("small", v2)      # bound once per version


def test_dropped_log_lines_are_exported(metrics, monkeypatch):
    import inferd.log

    monkeypatch.setattr(inferd.log, "dropped_lines", lambda: 7)
    samples = scrape(metrics)["inferd_log_lines_dropped"]
    assert value(samples, "inferd_log_lines_dropped_total") == 7

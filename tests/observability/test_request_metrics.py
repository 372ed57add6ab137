from __future__ import annotations

import threading

import pytest

from inferd.observability.metrics import Metrics
from inferd.types import EngineTiming, Usage
from tests.observability.harness import SIM_LABELS, StatsOnlyEngine, engines, metrics, scrape, value  # noqa: F401 (fixtures)


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


def test_step_observer_is_safe_from_an_engine_thread(metrics):
    observe = metrics.step_observer("small")
    threads = [threading.Thread(target=lambda: [observe(0.002) for _ in range(500)]) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f = scrape(metrics)["inferd_engine_step_seconds"]
    assert value(f, "inferd_engine_step_seconds_count", **SIM_LABELS) == 1000


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

from __future__ import annotations

from inferd.observability.metrics import OTHER, Metrics, observe_request
from inferd.types import Usage
from tests.observability.harness import SIM_LABELS, StatsOnlyEngine, engines, metrics, scrape, value  # noqa: F401 (fixtures)


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


def test_config_reload_counter(metrics):
    metrics.config_reloaded(True)
    metrics.config_reloaded(False)
    metrics.config_reloaded(False)
    f = scrape(metrics)["inferd_config_reload"]
    assert value(f, "inferd_config_reload_total", result="success") == 1
    assert value(f, "inferd_config_reload_total", result="error") == 2


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
    import inferd.observability.log

    monkeypatch.setattr(inferd.observability.log, "dropped_lines", lambda: 7)
    samples = scrape(metrics)["inferd_log_lines_dropped"]
    assert value(samples, "inferd_log_lines_dropped_total") == 7

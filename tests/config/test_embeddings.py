"""`task` and `[models.<name>.batching]`: what is checked, and where the batcher's latency target comes from."""
from __future__ import annotations

import pytest

from inferd.config import DEFAULT_LATENCY_TARGET_MS, ConfigError
from inferd.config.root import parse_config

SIM = {"backend": "sim", "task": "embed", "sim": {"profile": "tiny"}}


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    return exc.value.errors


def test_the_latency_target_comes_from_the_tightest_latency_slo_else_the_default():
    cfg = parse_config({"models": {"emb": SIM, "other": SIM}, "slos": {
        "loose": {"model": "emb", "sli": "latency", "threshold_ms": 80, "objective": 0.99},
        "tight": {"model": "emb", "sli": "latency", "threshold_ms": 30, "objective": 0.9},
        "ttft": {"model": "emb", "sli": "availability", "objective": 0.999}}})
    assert cfg.models["emb"].batching.latency_target_ms == 30
    assert cfg.models["other"].batching.latency_target_ms == DEFAULT_LATENCY_TARGET_MS


def test_an_explicit_target_wins_and_a_latency_slo_on_an_alias_reaches_its_models():
    cfg = parse_config({"models": {"a": {**SIM, "batching": {"latency_target_ms": 20}}, "b": SIM},
                        "aliases": {"embedder": {"split": {"a": 50, "b": 50}}},
                        "slos": {"s": {"model": "embedder", "sli": "latency", "threshold_ms": 70, "objective": 0.99}}})
    assert cfg.models["a"].batching.latency_target_ms == 20
    assert cfg.models["b"].batching.latency_target_ms == 70


def test_a_generation_model_gets_no_batching_table():
    cfg = parse_config({"models": {"chat": {"backend": "sim"}}})
    assert cfg.models["chat"].batching is None and cfg.models["chat"].task is None


@pytest.mark.parametrize("model, path", [
    ({"backend": "trtllm", "task": "embed"}, "models.m.task"),
    ({**SIM, "lora_adapters": {"a": "x"}}, "models.m.lora_adapters"),
    ({"backend": "sim", "task": "generate", "batching": {}}, "models.m.batching"),
    ({**SIM, "batching": {"latency_target_ms": 0}}, "models.m.batching.latency_target_ms"),
    ({**SIM, "batching": {"margin_ms": -1}}, "models.m.batching.margin_ms"),
    ({**SIM, "batching": {"min_wait_ms": 5, "max_wait_ms": 1}}, "models.m.batching.max_wait_ms"),
    ({**SIM, "batching": {"policy": "greedy"}}, "models.m.batching.policy"),
    ({**SIM, "task": "classify"}, "models.m.task"),
])
def test_bad_settings_name_their_key(model, path):
    errors = errors_of({"models": {"m": model}})
    assert any(e.startswith(path + ":") for e in errors), errors


def test_latency_slos_need_a_threshold():
    errors = errors_of({"models": {"m": SIM}, "slos": {"s": {"model": "m", "sli": "latency", "objective": 0.9}}})
    assert any(e.startswith("slos.s.threshold_ms:") for e in errors), errors

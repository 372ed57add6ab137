"""The `[models.X.torch]` table: its defaults and what it refuses."""
from __future__ import annotations

import pytest

from inferd.config.root import ConfigError, parse_config


def errors_of(model: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"models": {"m": model}})
    return info.value.errors


def test_a_torch_model_defaults_to_bf16_on_cuda_with_graphs_and_a_pool_from_free_memory():
    t = parse_config({"models": {"m": {"backend": "torch", "torch": {}}}}).models["m"].torch
    assert (t.device, t.dtype, t.gpu_memory_utilization, t.cuda_graphs, t.load_format) == (
        "cuda", "bfloat16", 0.9, True, "auto")


def test_a_torch_section_needs_the_torch_backend():
    assert errors_of({"backend": "reference", "torch": {}}) == [
        "models.m.torch: a [torch] section needs backend = \"torch\" (backend is 'reference')"]


@pytest.mark.parametrize("key, value, message", [
    ("device", "gpu", "models.m.torch.device: expected \"cuda\", \"cuda:N\" or \"cpu\", got 'gpu'"),
    ("device", "cuda:x", "models.m.torch.device: expected \"cuda\", \"cuda:N\" or \"cpu\", got 'cuda:x'"),
    ("gpu_memory_utilization", 0.0, "models.m.torch.gpu_memory_utilization: must be in (0, 1], got 0.0"),
    ("gpu_memory_utilization", 1.5, "models.m.torch.gpu_memory_utilization: must be in (0, 1], got 1.5"),
    ("cuda_graph_max_batch_size", 0, "models.m.torch.cuda_graph_max_batch_size: must be >= 1, got 0"),
    ("dtype", "int8", "models.m.torch.dtype: expected one of 'bfloat16', 'float16', 'float32', got 'int8'"),
    ("load_format", "pt", "models.m.torch.load_format: expected one of 'auto', 'dummy', got 'pt'"),
    ("gpu_memory_fraction", 0.5, "models.m.torch.gpu_memory_fraction: unknown key"),
])
def test_a_bad_torch_setting_is_named(key, value, message):
    errors = errors_of({"backend": "torch", "torch": {key: value}})
    assert any(e.startswith(message) for e in errors), errors


def test_torch_serves_generation_only():
    assert "models.m.task: backend 'torch' serves generation only; serve embedding models with backend " \
           "'reference' or 'sim'" in errors_of({"backend": "torch", "task": "embed"})

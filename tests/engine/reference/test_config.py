"""LlamaConfig: config.json with HF semantics (transformers 4.x and 5.x rope fields); refusals name the field."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferd.engine.reference.config import LlamaConfig, ModelConfigError

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def test_transformers4_rope_fields_parse_like_transformers5():
    legacy_scaling = {k: v for k, v in LLAMA3.items() if k != "rope_type"} | {"type": "llama3"}
    v4 = LlamaConfig.from_dict({**BASE, "rope_theta": 50000.0, "rope_scaling": legacy_scaling})
    v5 = LlamaConfig.from_dict({**BASE, "rope_parameters": {"rope_theta": 50000.0, **LLAMA3}})
    assert v4 == v5 and v5.rope_scaling is not None and v5.rope_theta == 50000.0


def test_no_rope_scaling_means_default_rope():
    config = LlamaConfig.from_dict({**BASE, "rope_scaling": None})
    assert config.rope_scaling is None and config.rope_theta == 10000.0
    assert config.head_dim == 16 and config.num_key_value_heads == 4


@pytest.mark.parametrize("change, field", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope_parameters.rope_type"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "rope_parameters.low_freq_factor"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"model_type": "mistral"}, "model_type"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
])
def test_unsupported_configs_raise_naming_the_field(change, field):
    with pytest.raises(ModelConfigError) as info:
        LlamaConfig.from_dict({**BASE, **change})
    assert info.value.field == field


def test_from_json_reports_an_unreadable_file(tmp_path: Path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="cannot read"):
        LlamaConfig.from_json(tmp_path / "config.json")

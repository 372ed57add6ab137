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


def test_qwen2_has_biases_on_q_k_v_and_none_on_o_proj_whatever_attention_bias_says():
    config = LlamaConfig.from_dict({**BASE, "model_type": "qwen2", "attention_bias": False,
                                    "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 21})
    assert (config.qkv_bias, config.o_bias, config.mlp_bias, config.qk_norm) == (True, False, False, False)


def test_qwen3_normalizes_q_and_k_heads_and_its_head_dim_defaults_to_128_as_transformers_does():
    config = LlamaConfig.from_dict({**BASE, "model_type": "qwen3"})
    assert (config.qk_norm, config.qkv_bias, config.o_bias, config.head_dim) == (True, False, False, 128)
    biased = LlamaConfig.from_dict({**BASE, "model_type": "qwen3", "attention_bias": True, "head_dim": 32})
    assert (biased.qkv_bias, biased.o_bias, biased.head_dim) == (True, True, 32)


def test_llama_attention_bias_puts_biases_on_every_attention_projection():
    config = LlamaConfig.from_dict({**BASE, "attention_bias": True})
    assert (config.model_type, config.qkv_bias, config.o_bias, config.qk_norm) == ("llama", True, True, False)


@pytest.mark.parametrize("change, field", [
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window"),
    ({"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"model_type": "qwen2_moe"}, "model_type"),
    ({"model_type": "qwen3", "attention_bias": "no"}, "attention_bias"),
])
def test_family_features_this_decoder_lacks_are_refused_naming_the_field(change, field):
    with pytest.raises(ModelConfigError) as info:
        LlamaConfig.from_dict({**BASE, **change})
    assert info.value.field == field

"""A Llama-family checkpoint's config.json, read and checked against what the NumPy decoder runs (HF semantics).

The decoder runs three model_types, which differ only in a few switches (FAMILIES):
- "llama" (TinyLlama, SmolLM2, Llama 3.x): `attention_bias` puts biases on q/k/v/o alike.
- "qwen2" (Qwen2, Qwen2.5): biases on q/k/v always, none on o_proj; transformers reads no attention_bias.
- "qwen3": an RMSNorm over each head of q and of k (q_norm/k_norm) before RoPE; head_dim defaults to 128,
  not hidden_size / heads, as transformers' Qwen3Config does.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np


class ModelConfigError(ValueError):
    """config.json describes something this decoder does not run; `field` names the culprit."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Llama3RopeScaling(msgspec.Struct, frozen=True, kw_only=True):
    """`rope_type: llama3` frequency scaling (Llama 3.1+)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


class LlamaConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The decoder's shape and switches, for every model_type of FAMILIES."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Llama3RopeScaling | None
    tie_word_embeddings: bool
    qkv_bias: bool             # biases on q_proj, k_proj, v_proj
    o_bias: bool               # a bias on o_proj
    mlp_bias: bool
    qk_norm: bool              # RMSNorm over each q and k head (q_norm/k_norm weights [head_dim]) before RoPE

    @classmethod
    def from_json(cls, path: Path) -> "LlamaConfig":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ModelConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelConfigError(f"{path}: config.json must be a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "LlamaConfig":
        """HF semantics: transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`)."""
        model_type = raw.get("model_type", "llama")
        if model_type not in FAMILIES:
            raise ModelConfigError(f"model_type {model_type!r} is not supported (supported: "
                                   f"{', '.join(repr(t) for t in FAMILIES)})", "model_type")
        if raw.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act {raw['hidden_act']!r} is not supported (only 'silu')",
                                   "hidden_act")
        _refuse_sliding_window(raw)
        hidden = _int(raw, "hidden_size")
        heads = _int(raw, "num_attention_heads")
        kv_heads = _int(raw, "num_key_value_heads", heads)
        if heads % kv_heads:
            raise ModelConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads "
                                   f"{kv_heads}", "num_key_value_heads")
        default_head_dim = FAMILIES[model_type]["head_dim"]
        if raw.get("head_dim") is None and default_head_dim is None and hidden % heads:
            raise ModelConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}",
                                   "hidden_size")
        head_dim = _int(raw, "head_dim", default_head_dim or hidden // heads)
        if head_dim % 2:
            raise ModelConfigError(f"head_dim {head_dim} must be even for rotary embeddings", "head_dim")
        max_pos = _int(raw, "max_position_embeddings", 2048)
        rope_field = "rope_parameters" if raw.get("rope_parameters") is not None else "rope_scaling"
        rope = raw.get(rope_field) or {}
        if not isinstance(rope, dict):
            raise ModelConfigError(f"{rope_field} must be an object", rope_field)
        theta = _float(rope, "rope_theta", _float(raw, "rope_theta", 10000.0), rope_field)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            scaling = Llama3RopeScaling(
                factor=_float(rope, "factor", None, rope_field),
                low_freq_factor=_float(rope, "low_freq_factor", None, rope_field),
                high_freq_factor=_float(rope, "high_freq_factor", None, rope_field),
                original_max_position_embeddings=_int(rope, "original_max_position_embeddings", max_pos, rope_field))
            if scaling.high_freq_factor <= scaling.low_freq_factor:
                raise ModelConfigError(f"{rope_field}.high_freq_factor must exceed low_freq_factor",
                                       f"{rope_field}.high_freq_factor")
        elif rope_type != "default":
            raise ModelConfigError(f"{rope_field}.rope_type {rope_type!r} is not supported "
                                   f"(supported: 'default', 'llama3')", f"{rope_field}.rope_type")
        return cls(
            model_type=model_type, vocab_size=_int(raw, "vocab_size"), hidden_size=hidden, intermediate_size=_int(raw, "intermediate_size"),
            num_hidden_layers=_int(raw, "num_hidden_layers"), num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=max_pos,
            rms_norm_eps=_float(raw, "rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
            tie_word_embeddings=_bool(raw, "tie_word_embeddings", False), **_switches(raw, model_type))

    def inv_freq(self) -> np.ndarray:
        """Rotary inverse frequencies [head_dim/2], float32, as transformers computes them."""
        dim = self.head_dim
        inv = 1.0 / self.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        s = self.rope_scaling
        if s is not None:
            low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
            high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor)
            smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            inv = np.where(medium, smoothed, scaled)
        return inv.astype(np.float32)


# model_type -> its defaults: head_dim (None: hidden_size / num_attention_heads), and which switches it has.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"head_dim": None, "qk_norm": False},
    "qwen2": {"head_dim": None, "qk_norm": False},
    "qwen3": {"head_dim": 128, "qk_norm": True},
}


def _switches(raw: dict, model_type: str) -> dict[str, bool]:
    """qkv_bias/o_bias/mlp_bias/qk_norm as transformers builds the model_type's layers."""
    if model_type == "qwen2":   # Qwen2Attention hard-codes bias=True on q/k/v, False on o; its MLP has none
        return {"qkv_bias": True, "o_bias": False, "mlp_bias": False, "qk_norm": False}
    bias = _bool(raw, "attention_bias", False)
    mlp_bias = _bool(raw, "mlp_bias", False) if model_type == "llama" else False
    return {"qkv_bias": bias, "o_bias": bias, "mlp_bias": mlp_bias, "qk_norm": FAMILIES[model_type]["qk_norm"]}


def _refuse_sliding_window(raw: dict) -> None:
    """Qwen checkpoints name a sliding_window but ship use_sliding_window false: only full attention runs here."""
    if raw.get("use_sliding_window"):
        raise ModelConfigError("use_sliding_window is true: sliding-window attention is not supported",
                               "use_sliding_window")
    layer_types = raw.get("layer_types") or []
    if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
        raise ModelConfigError(f"layer_types {layer_types!r} is not supported (only 'full_attention' layers)",
                               "layer_types")


def _get(raw: dict, key: str, default: Any, field: str | None) -> tuple[Any, str]:
    """The value of `key` (or `default`) and its path in config.json for error messages."""
    path = f"{field}.{key}" if field else key
    value = raw.get(key, default)
    if value is None:
        raise ModelConfigError(f"config.json lacks {path}", path)
    return value, path


def _int(raw: dict, key: str, default: int | None = None, field: str | None = None) -> int:
    value, path = _get(raw, key, default, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{path} must be a positive integer, got {value!r}", path)
    return value


def _float(raw: dict, key: str, default: float | None = None, field: str | None = None) -> float:
    value, path = _get(raw, key, default, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ModelConfigError(f"{path} must be a positive number, got {value!r}", path)
    return float(value)


def _bool(raw: dict, key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ModelConfigError(f"{key} must be true or false, got {value!r}", key)
    return value

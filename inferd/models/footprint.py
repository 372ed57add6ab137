"""How many bytes a model version holds once loaded, known before loading it (what the memory budget counts).

Estimated from what is on disk and in the config, without loading anything:
- `memory_bytes` in the model's table, when set, is the answer (an operator who measured it knows best);
- sim: the profile's weights (per GPU) + its runtime reserve + the KV pool the config gives it;
- reference: the parameters its config.json implies, as the float32 arrays the engine holds (an int8
  version's matrices at one byte an element, plus a float32 scale per output channel), + the KV pool
  (float32 K and V for every layer, `num_kv_blocks` x `block_size` slots);
- torch: the same parameters at its dtype's width (an int8 version's matrices at one byte, its scales at
  that width), + its KV pool at that width when its size is known
  (`num_kv_blocks`, or the CPU's default); on CUDA the pool is sized from free memory at load, which no
  estimate can know: set `memory_bytes` (or `num_kv_blocks`) for a torch model on CUDA under a budget;
- trtllm: the engine files' size (the weights). Its KV pool is a fraction of whatever GPU memory is
  free, which no estimate made before loading can know: set `memory_bytes` for a trtllm model under
  a budget.
After a load the engine may say what it really holds (`measured_bytes`), and that replaces the estimate.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from inferd.config import ModelConfig, ServerConfig, SimConfig, artifact_name

FLOAT32 = 4
DEFAULT_REFERENCE_KV_BLOCKS = 2048


class FootprintError(Exception):
    """The footprint cannot be estimated (no artifact, an unreadable config.json)."""


def estimate_bytes(name: str, model: ModelConfig, server: ServerConfig, artifact: Path | None = None) -> int:
    """Bytes version `model` of served model `name` will hold. `artifact`: its resolved directory (reference,
    trtllm); blocking file reads: call off the loop."""
    if model.memory_bytes is not None:
        return model.memory_bytes
    if model.backend == "sim":
        return _sim_bytes(model)
    if artifact is None:
        raise FootprintError(f"models.{name}: no artifact to estimate its memory from; set memory_bytes")
    if model.backend == "reference":
        return _reference_bytes(model, artifact)
    if model.backend == "torch":
        return _torch_bytes(name, model, artifact)
    return sum(f.stat().st_size for f in artifact.rglob("*") if f.is_file())


def _sim_bytes(model: ModelConfig) -> int:
    from inferd.engine.sim import get_profile

    sim = model.sim or SimConfig()
    profile = get_profile(sim.profile)
    blocks = model.num_kv_blocks or profile.num_kv_blocks(model.block_size)
    kv = blocks * model.block_size * profile.kv_bytes_per_token_per_gpu
    return int(profile.weight_bytes_per_gpu + profile.runtime_reserved_bytes + kv)


def _reference_bytes(model: ModelConfig, artifact: Path) -> int:
    shape = _shape_counts(model, artifact)
    return shape.weight_bytes(FLOAT32) + FLOAT32 * shape.kv_per_block * (model.num_kv_blocks
                                                                         or DEFAULT_REFERENCE_KV_BLOCKS)


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _torch_bytes(name: str, model: ModelConfig, artifact: Path) -> int:
    from inferd.config import TorchConfig

    t = model.torch or TorchConfig()
    blocks = model.num_kv_blocks or (DEFAULT_REFERENCE_KV_BLOCKS if t.device == "cpu" else None)
    if blocks is None:
        raise FootprintError(f"models.{name}: a torch model on {t.device} sizes its KV pool from free GPU memory "
                             f"at load; set memory_bytes (or num_kv_blocks) to put it under a memory budget")
    shape = _shape_counts(model, artifact)
    width = _DTYPE_BYTES[t.dtype]
    return shape.weight_bytes(width) + width * shape.kv_per_block * blocks


class ShapeCounts(NamedTuple):
    """What config.json implies: the weights' elements by kind, and the K/V entries of one KV block."""

    matrix_elements: int      # projections, embedding, LM head: int8 in an int8 version
    vector_elements: int      # norms: the engine's float width always
    channels: int             # output channels of the matrices: one scale each in an int8 version
    int8: bool                # an int8 weight-only version (inferd.engine.reference.quantize)
    kv_per_block: int

    def weight_bytes(self, width: int) -> int:
        """Bytes of the weights at float width `width`; an int8 version's scales are at that width too."""
        if self.int8:
            return self.matrix_elements + width * (self.channels + self.vector_elements)
        return width * (self.matrix_elements + self.vector_elements)


def _shape_counts(model: ModelConfig, artifact: Path) -> ShapeCounts:
    from inferd.artifacts.build import INT8_QUANT_METHOD

    try:
        c = json.loads((artifact / "config.json").read_text())
        hidden, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        head_dim = c.get("head_dim") or hidden // heads
        inter = c["intermediate_size"]
        quantization = c.get("quantization_config") or {}
        int8 = quantization.get("quant_method") == INT8_QUANT_METHOD
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, AttributeError) as exc:
        raise FootprintError(f"{artifact / 'config.json'}: cannot estimate the model's size: {exc}") from None
    attention = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    tables = 1 if c.get("tie_word_embeddings", False) else 2
    matrices = layers * (attention + 3 * hidden * inter) + tables * vocab * hidden
    channels = layers * ((heads + 2 * kv_heads) * head_dim + hidden + 2 * inter + hidden) + tables * vocab
    return ShapeCounts(matrices, layers * 2 * hidden + hidden, channels, int8,
                       2 * layers * model.block_size * kv_heads * head_dim)


def measured_bytes(engine: object) -> int | None:
    """What a loaded engine says it holds, when it can say (`memory_bytes()`), else None."""
    measure = getattr(engine, "memory_bytes", None)
    if measure is None:
        return None
    try:
        return int(measure())
    except Exception:  # noqa: BLE001 - a measurement that fails leaves the estimate in place
        return None


def artifact_dir(name: str, model: ModelConfig, server: ServerConfig, version: str) -> Path | None:
    """The artifact directory a version of `model` loads from (None: it has none, a sim)."""
    if model.backend == "sim":
        return None
    if model.backend == "trtllm" and model.trtllm is not None and model.trtllm.engine_dir:
        return Path(model.trtllm.engine_dir)
    from inferd.artifacts import resolve_artifact

    return resolve_artifact(Path(server.engines_root), artifact_name(name, model), version)

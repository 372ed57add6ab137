"""LoRA in the torch decoder: an adapter's deltas equal the reference NumPy decoder's with the same LoraWeights,
per group of rows (adapters mixed in one step, scattered rows, sequences without one), converted once."""
from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.engine.torch.steps import Chunk, scheduler_output, step_inputs

from inferd.engine.reference.adapter_registry import resolve_source
from inferd.engine.reference.lora import LoraWeights, load_lora
from inferd.engine.reference.model import ForwardBatch, LlamaModel
from inferd.engine.torch import lora as torch_lora_module
from inferd.engine.torch.model import TorchLlama

BLOCK = 4
PROMPTS = [[10, 20, 30, 40, 50, 60, 70], [11, 21, 31], [12, 22, 32, 42, 52], [13, 23, 33, 43]]
TABLES = [[3, 8], [0], [5, 1], [9]]


@pytest.fixture(scope="module")
def models(tiny_artifact: Path) -> tuple[LlamaModel, TorchLlama]:
    return LlamaModel.from_pretrained(tiny_artifact), TorchLlama.from_pretrained(tiny_artifact, device="cpu",
                                                                                 dtype=torch.float32)


@pytest.fixture(scope="module")
def adapters(tiny_adapters, models) -> dict[str, LoraWeights]:
    reference, _ = models
    return {name: load_lora(name, resolve_source(path), reference.config) for name, path in tiny_adapters.items()}


def both(models, chunks: list[Chunk], loras: list[LoraWeights | None]) -> tuple[np.ndarray, np.ndarray]:
    """The step's logits from the reference decoder and the torch one, each in a fresh pool."""
    reference, model = models
    out = scheduler_output(chunks, BLOCK)
    kv = reference.new_kv_cache(num_blocks=12, block_size=BLOCK)
    expected = reference.forward(ForwardBatch(token_ids=out.token_ids, positions=out.positions,
                                              slot_mapping=out.slot_mapping, query_lens=out.num_new_tokens,
                                              context_lens=out.context_lens, block_tables=out.block_tables,
                                              loras=loras), kv)
    pool = model.new_kv_pool(num_blocks=12, block_size=BLOCK)
    got = model.forward(step_inputs(chunks, BLOCK, [model.lora(w) for w in loras]), pool)
    return got.numpy(), expected


def test_a_step_mixing_two_adapters_and_none_gives_each_row_the_reference_deltas(models, adapters):
    """"all" holds rows of sequences 0 and 3 (scattered rows), "qvd" sequence 2's, sequence 1 has none."""
    loras = [adapters["all"], None, adapters["qvd"], adapters["all"]]
    got, expected = both(models, [Chunk(p, t) for p, t in zip(PROMPTS, TABLES)], loras)
    base, _ = both(models, [Chunk(p, t) for p, t in zip(PROMPTS, TABLES)], [None] * 4)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=1e-4 * scale)
    assert np.abs(got[[0, 2, 3]] - base[[0, 2, 3]]).max() > 1e-2 * scale, "the adapters change their rows"
    np.testing.assert_allclose(got[1], base[1], atol=1e-5 * scale)


def test_decode_rows_with_an_adapter_get_its_deltas(models, adapters):
    chunks = [Chunk(p, t, start=len(p) - 1) for p, t in zip(PROMPTS, TABLES)]
    got, expected = both(models, chunks, [adapters["qvd"], adapters["qvd"], None, adapters["all"]])
    np.testing.assert_allclose(got, expected, atol=1e-4 * np.abs(expected).max())


def test_an_adapter_is_converted_once_per_dtype_and_let_go_with_its_weights(models, adapters, tiny_adapters):
    _, model = models
    assert model.lora(adapters["qvd"]) is model.lora(adapters["qvd"])
    assert model.lora(None) is None
    converted = model.lora(adapters["qvd"])
    a, b = converted.layers[0]["qkv"]
    c = model.config
    assert a.shape == (c.hidden_size, 2 * 2) and b.shape == (2 * 2, (c.num_attention_heads + 2 * c.num_key_value_heads)
                                                               * c.head_dim)
    assert "o" not in converted.layers[0], "a projection the adapter does not target adds nothing"
    fresh = load_lora("qvd", resolve_source(tiny_adapters["qvd"]), c)
    model.lora(fresh)
    assert fresh in torch_lora_module._cache
    del fresh
    gc.collect()
    assert len(torch_lora_module._cache) == sum(1 for w in adapters.values() if w in torch_lora_module._cache)

"""TorchLlama beyond family parity: the fixed-shape decode pass (padding, graph safety), the decode attention
seam, random dummy weights, and the checks on devices, dtypes and inputs."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from tests.hf_checkpoints import save_checkpoint, torch

from torch.utils._python_dispatch import TorchDispatchMode
from tests.engine.torch.steps import Chunk, scheduler_output, step_inputs

from inferd.engine.reference.config import LlamaConfig
from inferd.engine.torch.attention import sdpa_paged_decode
from inferd.engine.torch.inputs import DecodeInputs, StepInputs
from inferd.engine.torch.model import TorchLlama, TorchModelError

BLOCK = 4
NUM_BLOCKS = 16
PROMPTS = [[257, 84, 82, 68, 81], [71, 127, 102, 75, 75, 78, 258, 198, 257], [64, 82, 90, 91, 92, 93, 94, 95, 96,
                                                                                97, 98, 99, 100]]
TABLES = [[11, 2], [7, 0, 13], [5, 9, 1, 14]]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> TorchLlama:
    directory = tmp_path_factory.mktemp("qwen3")
    save_checkpoint(directory, "qwen3", seed=4)
    return TorchLlama.from_pretrained(directory, device="cpu", dtype=torch.float32)


def prefilled(model: TorchLlama):
    """A pool holding PROMPTS' K/V, and each prompt's greedy next token."""
    pool = model.new_kv_pool(num_blocks=NUM_BLOCKS, block_size=BLOCK)
    logits = model.forward(step_inputs([Chunk(p, t) for p, t in zip(PROMPTS, TABLES)], BLOCK), pool)
    return pool, logits.argmax(dim=-1).tolist()


def padded_decode(tokens: list[int], rows: int, max_blocks: int, scratch_slot: int) -> DecodeInputs:
    """DecodeInputs for PROMPTS + tokens, padded to `rows` as the graph runner pads them."""
    live = len(tokens)
    contexts = [len(p) + 1 for p in PROMPTS]
    positions = [c - 1 for c in contexts]
    slots = [t[p // BLOCK] * BLOCK + p % BLOCK for t, p in zip(TABLES, positions)]
    tables = np.zeros((rows, max_blocks), np.int32)
    for i, t in enumerate(TABLES):
        tables[i, :len(t)] = t
    pad = rows - live
    return DecodeInputs(token_ids=torch.tensor(tokens + [0] * pad), positions=torch.tensor(positions + [0] * pad),
                        slot_mapping=torch.tensor(slots + [scratch_slot] * pad), block_tables=torch.from_numpy(tables),
                        context_lens=torch.tensor(contexts + [0] * pad, dtype=torch.int32))


def test_decode_forward_on_padded_rows_equals_forward_for_the_live_rows_and_writes_only_their_slots(model):
    eager, tokens = prefilled(model)
    graphed, _ = prefilled(model)
    expected = model.forward(step_inputs([Chunk(p + [t], b, len(p)) for p, t, b in zip(PROMPTS, tokens, TABLES)],
                                         BLOCK), eager)
    inputs = padded_decode(tokens, rows=8, max_blocks=6, scratch_slot=graphed.scratch_slot)
    before = [t.clone() for t in graphed.k + graphed.v]

    logits = model.decode_forward(inputs, graphed)

    assert logits.shape == (8, model.config.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[:3], expected, rtol=0, atol=1e-4)
    live = inputs.slot_mapping[:3]
    untouched = torch.ones(NUM_BLOCKS * BLOCK, dtype=torch.bool)
    untouched[live] = False
    for old, new, eager_side in zip(before, graphed.k + graphed.v, eager.k + eager.v):
        flat_old, flat_new = old.flatten(0, 1)[:NUM_BLOCKS * BLOCK], new.flatten(0, 1)[:NUM_BLOCKS * BLOCK]
        assert torch.equal(flat_new[untouched], flat_old[untouched]), "only the live rows' slots are written"
        torch.testing.assert_close(flat_new[live], eager_side.flatten(0, 1)[live], rtol=0, atol=1e-5)
    assert graphed.k[0][NUM_BLOCKS].abs().sum() > 0, "padding rows write their K/V to the scratch block"


class _HostReads(TorchDispatchMode):
    """Records the ops that read a tensor's value back to the host or size an output by its values."""

    SYNCING: ClassVar[set[str]] = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique", "_unique2",
               "item", "repeat_interleave"}

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


def test_decode_forward_never_reads_a_tensor_value_back_to_the_host(model):
    """What CUDA graph capture needs (checked on the CPU: the same ops would sync a CUDA stream)."""
    pool, tokens = prefilled(model)
    inputs = padded_decode(tokens, rows=4, max_blocks=4, scratch_slot=pool.scratch_slot)
    with _HostReads() as reads:
        model.decode_forward(inputs, pool)
    assert reads.found == []


def test_decode_rows_go_through_the_model_decode_attention_with_the_kernel_contract(model, monkeypatch):
    calls = []

    def spy(q, k_cache, v_cache, block_tables, context_lens, out=None):
        calls.append((q.shape, block_tables.dtype, context_lens.dtype, k_cache.shape))
        return sdpa_paged_decode(q, k_cache, v_cache, block_tables, context_lens, out)

    pool, tokens = prefilled(model)
    monkeypatch.setattr(model, "decode_attention", spy)
    model.decode_forward(padded_decode(tokens, rows=4, max_blocks=4, scratch_slot=pool.scratch_slot), pool)
    c = model.config
    assert calls == [((4, c.num_attention_heads, c.head_dim), torch.int32, torch.int32,
                      (NUM_BLOCKS + 1, BLOCK, c.num_key_value_heads, c.head_dim))] * c.num_hidden_layers

    monkeypatch.setattr(model, "decode_attention", lambda q, *rest, out=None: torch.zeros_like(q))
    pool, tokens = prefilled(model)
    silenced = model.forward(step_inputs([Chunk(p + [t], b, len(p)) for p, t, b in zip(PROMPTS, tokens, TABLES)],
                                         BLOCK), pool)
    pool, _ = prefilled(model)
    monkeypatch.undo()
    normal = model.forward(step_inputs([Chunk(p + [t], b, len(p)) for p, t, b in zip(PROMPTS, tokens, TABLES)],
                                       BLOCK), pool)
    assert not torch.allclose(silenced, normal), "a step's decode rows attend through model.decode_attention"


LLAMA3_SHAPED = {"model_type": "llama", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                 "rope_theta": 500000.0}


def test_dummy_weights_are_made_in_the_model_dtype_and_give_finite_logits():
    config = LlamaConfig.from_dict(LLAMA3_SHAPED)
    model = TorchLlama.dummy(config, device="cpu", dtype=torch.bfloat16, seed=1)
    pool = model.new_kv_pool(num_blocks=8, block_size=BLOCK)

    logits = model.forward(step_inputs([Chunk(list(range(20)), [3, 1, 4, 0, 5])], BLOCK), pool)

    assert torch.isfinite(logits).all() and logits.std() > 0
    assert model.embed.dtype == model.layers[0].wqkv.dtype == torch.bfloat16
    assert model.layers[0].wqkv.shape == ((4 + 2 * 2) * 16, 64)
    per_layer = 2 * 64 + (8 * 16 * 64) + 64 * 64 + 2 * 96 * 64 + 96 * 64
    assert model.weight_bytes() == 2 * (2 * 320 * 64 + 64 + 2 * per_layer)     # untied: embedding and LM head
    again = TorchLlama.dummy(config, device="cpu", dtype=torch.bfloat16, seed=1)
    assert torch.equal(again.layers[1].wd, model.layers[1].wd)


def test_a_device_or_dtype_this_machine_cannot_run_is_refused_by_name():
    config = LlamaConfig.from_dict(LLAMA3_SHAPED)
    if not torch.cuda.is_available():
        with pytest.raises(TorchModelError, match="cuda"):
            TorchLlama.dummy(config, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TorchModelError, match="dtype"):
        TorchLlama.dummy(config, device="cpu", dtype=torch.int8)
    with pytest.raises(TorchModelError, match="device"):
        TorchLlama.dummy(config, device="meta", dtype=torch.float32)


def test_inputs_that_do_not_fit_the_model_or_its_pool_are_refused_before_they_reach_the_device(model):
    pool = model.new_kv_pool(num_blocks=4, block_size=BLOCK)
    with pytest.raises(TorchModelError, match="token ids"):
        model.forward(step_inputs([Chunk([1, 2, model.config.vocab_size], [0])], BLOCK), pool)
    with pytest.raises(TorchModelError, match="block ids"):
        model.forward(step_inputs([Chunk([1, 2, 3], [4])], BLOCK), pool)
    short_table = scheduler_output([Chunk([1, 2, 3, 4, 5, 6], [1, 2], start=5)], BLOCK)
    short_table.block_tables = [[1]]
    with pytest.raises(TorchModelError, match="context_len 6"):
        model.forward(StepInputs.build(short_table, "cpu"), pool)
    other = TorchLlama.dummy(LlamaConfig.from_dict(LLAMA3_SHAPED), device="cpu", dtype=torch.float32)
    with pytest.raises(TorchModelError, match="new_kv_pool"):
        model.forward(step_inputs([Chunk([1, 2, 3], [0])], BLOCK), other.new_kv_pool(4, BLOCK))

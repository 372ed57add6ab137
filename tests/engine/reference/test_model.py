"""The NumPy decoder against HF transformers' LlamaForCausalLM on small random checkpoints."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd.engine.reference.kv_cache import PagedKVCache
from inferd.engine.reference.model import ForwardBatch, ForwardBatchError, LlamaModel
from inferd.engine.reference.sampler import token_logprobs

# The `parity` extra (in `test`) installs both, so CI runs this module. A GPU node's pytest (the
# `gpu-test` extra beside TensorRT-LLM's own torch/transformers) may lack them or have transformers 4.x,
# which ignores the `rope_parameters` the llama3-rope variant below is written with: skip there.
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5")
HFLlamaConfig, LlamaForCausalLM = transformers.LlamaConfig, transformers.LlamaForCausalLM

VOCAB, BLOCK = 128, 4
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=256, initializer_range=0.15, rms_norm_eps=1e-5)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
VARIANTS = {
    "gqa-untied": dict(num_key_value_heads=2),
    "tied-theta": dict(tie_word_embeddings=True, rope_theta=500000.0, num_key_value_heads=1),
    "llama3-rope": dict(num_key_value_heads=2, tie_word_embeddings=True,
                        rope_parameters={"rope_theta": 50000.0, **LLAMA3}),
    "bias-headdim": dict(attention_bias=True, mlp_bias=True, head_dim=24, num_key_value_heads=2),
}


def save_hf_model(directory: Path, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(HFLlamaConfig(**{**BASE, **overrides})).eval()
    model.to(dtype).save_pretrained(directory, max_shard_size="100KB")   # sharded on purpose
    return model.float()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory) -> tuple[LlamaForCausalLM, LlamaModel]:
    directory = tmp_path_factory.mktemp(request.param)
    hf = save_hf_model(directory, **VARIANTS[request.param])
    return hf, LlamaModel.from_pretrained(directory)


def hf_logits(hf: LlamaForCausalLM, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([list(ids)])).logits[0].numpy()


class Sequence:
    """Test-side bookkeeping of one sequence's blocks, as the engine's block manager would keep it."""

    def __init__(self, kv: PagedKVCache, blocks: list[int], tokens: list[int]):
        self.kv, self.blocks, self.tokens, self.computed = kv, blocks, list(tokens), 0


def step(model: LlamaModel, kv: PagedKVCache, work: list[tuple[Sequence, int]]) -> np.ndarray:
    """One packed step: each (sequence, n) computes its next n uncomputed tokens."""
    return model.forward(_batch(kv, work), kv)


def shuffled_blocks(num_blocks: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).permutation(num_blocks).tolist()


def test_logits_at_every_prompt_position_match_hf(pair):
    """Every prefix of the prompt is its own sequence in one step: its last logits are HF's at that position."""
    hf, model = pair
    prompt = np.random.default_rng(2).integers(0, VOCAB, 13).tolist()
    kv = model.new_kv_cache(num_blocks=64, block_size=BLOCK)
    free = shuffled_blocks(64, seed=3)
    seqs = [Sequence(kv, [free.pop() for _ in range(-(-n // BLOCK))], prompt[:n]) for n in range(1, 14)]

    ours = step(model, kv, [(s, len(s.tokens)) for s in seqs])

    expected = hf_logits(hf, prompt)
    assert np.abs(ours - expected).max() <= 1e-3
    assert np.abs(expected).max() > 0.5, "logits too flat to tell models apart"


def test_greedy_continuation_through_paged_kv_matches_hf(pair):
    """Chunked prefill (12 + 7 tokens) then 16 decode steps, next to a second sequence decoding alongside."""
    hf, model = pair
    rng = np.random.default_rng(4)
    prompt, other_prompt = rng.integers(0, VOCAB, 19).tolist(), rng.integers(0, VOCAB, 6).tolist()
    kv = model.new_kv_cache(num_blocks=32, block_size=BLOCK)
    free = shuffled_blocks(32, seed=5)
    seq = Sequence(kv, [free.pop() for _ in range(10)], prompt)
    other = Sequence(kv, [free.pop() for _ in range(7)], other_prompt)

    step(model, kv, [(other, 6), (seq, 12)])
    other.tokens.append(int(rng.integers(0, VOCAB)))
    logits = step(model, kv, [(seq, 7), (other, 1)])
    worst = 0.0
    for _ in range(16):
        expected = hf_logits(hf, seq.tokens)[-1]
        worst = max(worst, float(np.abs(logits[0] - expected).max()))
        assert int(logits[0].argmax()) == int(expected.argmax())
        seq.tokens.append(int(logits[0].argmax()))
        other.tokens.append(int(rng.integers(0, VOCAB)))
        logits = step(model, kv, [(seq, 1), (other, 1)])
    assert worst <= 1e-3
    np.testing.assert_allclose(logits[1], hf_logits(hf, other.tokens)[-1], atol=1e-3)


def test_prefix_blocks_shared_with_another_sequence_are_attended(pair):
    """A sequence that reuses another's two full blocks computes only its suffix, from position 8."""
    hf, model = pair
    rng = np.random.default_rng(6)
    prefix = rng.integers(0, VOCAB, 2 * BLOCK).tolist()
    kv = model.new_kv_cache(num_blocks=16, block_size=BLOCK)
    first = Sequence(kv, [9, 4, 11], prefix + rng.integers(0, VOCAB, 3).tolist())
    step(model, kv, [(first, len(first.tokens))])
    second = Sequence(kv, [9, 4, 2, 7], prefix + rng.integers(0, VOCAB, 5).tolist())
    second.computed = len(prefix)

    ours = step(model, kv, [(second, 5)])

    np.testing.assert_allclose(ours[0], hf_logits(hf, second.tokens)[-1], atol=1e-3)


def test_logprobs_at_every_prompt_position_equal_hf_log_softmax_through_chunks(pair):
    """forward_every over a prefill in two chunks (beside another sequence) then token_logprobs: each prompt
    token's log-probability and its top 5 are transformers' log_softmax of the same checkpoint within 1e-4."""
    hf, model = pair
    rng = np.random.default_rng(8)
    prompt, other_prompt = rng.integers(0, VOCAB, 15).tolist(), rng.integers(0, VOCAB, 5).tolist()
    kv = model.new_kv_cache(num_blocks=32, block_size=BLOCK)
    free = shuffled_blocks(32, seed=9)
    seq, other = Sequence(kv, [free.pop() for _ in range(4)], prompt), Sequence(kv, [free.pop() for _ in range(2)],
                                                                                  other_prompt)
    rows = []
    for work in ([(other, 5), (seq, 9)], [(seq, 6)]):
        last, full = model.forward_every(_batch(kv, work), kv, [len(work) - 1])
        rows.append(full[0])
    logits = np.concatenate(rows)            # [15, vocab]: position j scores token j + 1
    expected = torch.log_softmax(torch.tensor(hf_logits(hf, prompt), dtype=torch.float64), dim=-1).numpy()
    found = token_logprobs(logits[:-1], prompt[1:], [5] * 14)
    for j, entry in enumerate(found):
        assert abs(entry.logprob - expected[j, prompt[j + 1]]) <= 1e-4
        ids = [t for t, _ in entry.top]
        assert ids == np.argsort(-expected[j], kind="stable")[:5].tolist()
        np.testing.assert_allclose([v for _, v in entry.top], expected[j, ids], atol=1e-4)
    np.testing.assert_allclose(last[0], hf_logits(hf, prompt)[-1], atol=1e-3)   # the next token's, as forward's


def _batch(kv: PagedKVCache, work: list[tuple[Sequence, int]]) -> ForwardBatch:
    """Each (sequence, n) of `work` computing its next n uncomputed tokens, packed."""
    ids, positions, slots = [], [], []
    for seq, n in work:
        pos = np.arange(seq.computed, seq.computed + n)
        ids.append(np.asarray(seq.tokens)[pos])
        positions.append(pos)
        slots.append(kv.slots_for_positions(seq.blocks, pos))
        seq.computed += n
    return ForwardBatch(token_ids=np.concatenate(ids), positions=np.concatenate(positions),
                        slot_mapping=np.concatenate(slots), query_lens=[n for _, n in work],
                        context_lens=[seq.computed for seq, _ in work], block_tables=[s.blocks for s, _ in work])


def test_bf16_checkpoint_matches_hf_loading_it_as_float32(tmp_path: Path):
    save_hf_model(tmp_path, seed=7, dtype=torch.bfloat16, num_key_value_heads=2)
    hf = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    model = LlamaModel.from_pretrained(tmp_path)
    prompt = list(range(3, 12))
    kv = model.new_kv_cache(num_blocks=4, block_size=BLOCK)

    ours = step(model, kv, [(Sequence(kv, [3, 0, 1], prompt), len(prompt))])

    np.testing.assert_allclose(ours[0], hf_logits(hf, prompt)[-1], atol=1e-3)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> LlamaModel:
    directory = tmp_path_factory.mktemp("small")
    save_hf_model(directory, num_key_value_heads=2)
    return LlamaModel.from_pretrained(directory)


@pytest.mark.parametrize("change, message", [
    ({"positions": np.array([0, 1, 3])}, "positions"),
    ({"slot_mapping": np.array([4, 5, 7])}, "slot_mapping"),
    ({"token_ids": np.array([0, 1, VOCAB])}, "token_ids"),
    ({"token_ids": np.array([0, 1])}, "token_ids has 2 entries"),
    ({"query_lens": [4]}, "query_len"),
    ({"block_tables": [[99]]}, "block ids"),
    ({"context_lens": [3, 1]}, "one entry per sequence"),
])
def test_inconsistent_batches_raise_forward_batch_error(small_model, change, message):
    kv = small_model.new_kv_cache(num_blocks=8, block_size=BLOCK)
    batch = dict(token_ids=np.array([0, 1, 2]), positions=np.array([0, 1, 2]), slot_mapping=np.array([4, 5, 6]),
                 query_lens=[3], context_lens=[3], block_tables=[[1]])
    with pytest.raises(ForwardBatchError, match=message):
        small_model.forward(ForwardBatch(**{**batch, **change}), kv)


def test_kv_cache_of_another_shape_is_rejected(small_model):
    kv = PagedKVCache(num_layers=2, num_blocks=4, block_size=BLOCK, num_kv_heads=4, head_dim=16)
    batch = ForwardBatch(token_ids=np.array([1]), positions=np.array([0]), slot_mapping=np.array([0]),
                         query_lens=[1], context_lens=[1], block_tables=[[0]])
    with pytest.raises(ForwardBatchError, match="new_kv_cache"):
        small_model.forward(batch, kv)

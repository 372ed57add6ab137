"""The NumPy decoder against transformers on a random checkpoint of each family people start with:
TinyLlama (GQA), SmolLM2 (tied embeddings), Llama 3.x (llama3 rope scaling), Qwen2 and Qwen2.5 (q/k/v biases),
Qwen3 (per-head q/k RMSNorm, head_dim apart from hidden/heads). Checkpoints come from tests/hf_checkpoints.py."""
from __future__ import annotations

import numpy as np
import pytest

from tests.hf_checkpoints import FAMILIES, save_checkpoint, torch, transformers

from inferd.engine.reference.kv_cache import PagedKVCache
from inferd.engine.reference.model import ForwardBatch, LlamaModel

BLOCK = 4
PROMPT = [257, 84, 82, 68, 81, 198, 71, 127, 102, 75, 75, 78, 258, 198, 257, 64, 82]   # ChatML-shaped, 17 tokens


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param.replace(".", "_"))
    hf = save_checkpoint(directory, request.param, max_shard_size="50KB" if request.param == "qwen3" else None)
    return request.param, hf, LlamaModel.from_pretrained(directory)


def hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


def prefill(model: LlamaModel, kv: PagedKVCache, blocks: list[int], ids: list[int], start: int = 0):
    """Tokens ids[start:] as one step of a sequence whose first `start` tokens are in the cache."""
    positions = np.arange(start, len(ids))
    batch = ForwardBatch(token_ids=np.asarray(ids[start:]), positions=positions,
                         slot_mapping=kv.slots_for_positions(blocks, positions), query_lens=[len(ids) - start],
                         context_lens=[len(ids)], block_tables=[blocks])
    return model.forward_every(batch, kv, [0])


def test_the_checkpoint_has_what_makes_its_family(pair):
    family, hf, model = pair
    c = model.config
    assert c.model_type == FAMILIES[family][0]
    expect = {"tinyllama": (False, False, False, False), "smollm2": (True, False, False, False),
              "llama3": (True, False, False, True), "qwen2": (False, True, False, False),
              "qwen2.5": (True, True, False, False), "qwen3": (True, False, True, False)}[family]
    assert (c.tie_word_embeddings, c.qkv_bias and not c.o_bias, c.qk_norm, c.rope_scaling is not None) == expect
    assert c.num_key_value_heads < c.num_attention_heads
    if family == "qwen3":
        assert c.head_dim * c.num_attention_heads != c.hidden_size


def test_logits_at_every_prompt_position_match_transformers(pair):
    family, hf, model = pair
    kv = model.new_kv_cache(num_blocks=8, block_size=BLOCK)
    last, (every,) = prefill(model, kv, [5, 1, 7, 0, 2], PROMPT)
    expected = hf_logits(hf, PROMPT)
    assert np.abs(expected).max() > 1.0, "logits too flat to tell models apart"
    np.testing.assert_allclose(every, expected, atol=2e-4 * np.abs(expected).max())
    np.testing.assert_allclose(last[0], every[-1], atol=1e-5)


def test_greedy_continuation_through_the_paged_cache_equals_transformers_generate(pair):
    """Prefill in two chunks, then 20 decode steps of one token each: the tokens are generate()'s."""
    family, hf, model = pair
    new_tokens = 20
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, pad_token_id=256)
    expected = out[0, len(PROMPT):].tolist()
    kv = model.new_kv_cache(num_blocks=16, block_size=BLOCK)
    blocks = [9, 3, 14, 0, 7, 11, 2, 5, 12, 1]
    ids = list(PROMPT)
    prefill(model, kv, blocks, ids[:10])
    logits, _ = prefill(model, kv, blocks, ids, start=10)
    for _ in range(new_tokens):
        ids.append(int(logits[0].argmax()))
        logits, _ = prefill(model, kv, blocks, ids, start=len(ids) - 1)
    assert ids[len(PROMPT):] == expected
    assert len(set(expected)) > 3, "a continuation that repeats one token tells little"


def test_final_hidden_states_match_the_transformers_base_model(pair):
    """What the embedder pools (Qwen3-Embedding and gte-Qwen2 are such checkpoints): encode_hidden is the base
    model's last_hidden_state, for two sequences of different lengths encoded in one packed pass."""
    family, hf, model = pair
    ours = model.encode_hidden([PROMPT, PROMPT[3:9]])
    with torch.no_grad():
        for ids, hidden in zip([PROMPT, PROMPT[3:9]], ours):
            theirs = hf.model(torch.tensor([ids])).last_hidden_state[0].numpy()
            np.testing.assert_allclose(hidden, theirs, atol=2e-4 * np.abs(theirs).max())


def test_a_bf16_qwen_checkpoint_matches_transformers_loading_it_as_float32(tmp_path):
    save_checkpoint(tmp_path, "qwen2.5", seed=3, dtype=torch.bfloat16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    model = LlamaModel.from_pretrained(tmp_path)
    kv = model.new_kv_cache(num_blocks=8, block_size=BLOCK)
    last, _ = prefill(model, kv, [4, 6, 1, 3, 0], PROMPT)
    expected = hf_logits(hf, PROMPT)[-1]
    np.testing.assert_allclose(last[0], expected, atol=2e-4 * np.abs(expected).max())

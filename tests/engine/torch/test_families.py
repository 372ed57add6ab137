"""The torch decoder against transformers on a random checkpoint of each family the reference serves (TinyLlama
GQA, SmolLM2 tied, Llama 3.x rope scaling, Qwen2/2.5 q/k/v biases, Qwen3 q/k norm), float32 on the CPU, through
the paged pool: prefill chunks, a shared prefix block, blocks out of order, decode rows beside a prefill chunk."""
from __future__ import annotations

import numpy as np
import pytest

from tests.hf_checkpoints import FAMILIES, save_checkpoint, torch, transformers

from tests.engine.torch.steps import Chunk, step_inputs

from inferd.engine.torch.model import TorchLlama

BLOCK = 4
PROMPT = [257, 84, 82, 68, 81, 198, 71, 127, 102, 75, 75, 78, 258, 198, 257, 64, 82]   # ChatML-shaped, 17 tokens
OTHER = PROMPT[:8] + [90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 103]            # shares PROMPT's 2 blocks


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param.replace(".", "_"))
    hf = save_checkpoint(directory, request.param, max_shard_size="50KB" if request.param == "qwen3" else None)
    return hf, TorchLlama.from_pretrained(directory, device="cpu", dtype=torch.float32)


def hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


def hf_generate(hf, ids: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, pad_token_id=256)
    return out[0, len(ids):].tolist()


def test_logits_at_every_prompt_position_match_transformers(pair):
    hf, model = pair
    pool = model.new_kv_pool(num_blocks=8, block_size=BLOCK)
    last, (every,) = model.forward_every(step_inputs([Chunk(PROMPT, [5, 1, 7, 0, 2])], BLOCK), pool, [0])
    expected = hf_logits(hf, PROMPT)
    assert np.abs(expected).max() > 1.0, "logits too flat to tell models apart"
    assert every.dtype == last.dtype == torch.float32
    np.testing.assert_allclose(every.numpy(), expected, atol=2e-4 * np.abs(expected).max())
    np.testing.assert_allclose(last[0].numpy(), every[-1].numpy(), atol=1e-5)


def test_greedy_continuations_through_the_paged_pool_equal_transformers_generate(pair):
    """PROMPT in two chunks; OTHER starts from PROMPT's first two blocks (a prefix-cache hit) and prefills the
    rest in two chunks, the second beside PROMPT's decode row; then both decode one token a step together."""
    hf, model = pair
    new_tokens = 12
    pool = model.new_kv_pool(num_blocks=24, block_size=BLOCK)
    a = Chunk(list(PROMPT), [9, 3, 14, 0, 7, 11, 2, 5, 12])
    b = Chunk(list(OTHER), [9, 3, 20, 17, 1, 22, 4, 15, 19])
    a.start = 0
    step = [Chunk(a.ids[:10], a.blocks)]
    model.forward(step_inputs(step, BLOCK), pool)
    a.start, b.ids, b.start = 10, OTHER[:14], 8
    logits = model.forward(step_inputs([a, b], BLOCK), pool)
    a.ids.append(int(logits[0].argmax()))
    a.start, b.start, b.ids = len(a.ids) - 1, 14, list(OTHER)
    logits = model.forward(step_inputs([a, b], BLOCK), pool)
    for seq, row in ((a, logits[0]), (b, logits[1])):
        seq.ids.append(int(row.argmax()))
    while len(b.ids) < len(OTHER) + new_tokens:
        a.start, b.start = len(a.ids) - 1, len(b.ids) - 1
        logits = model.forward(step_inputs([b, a], BLOCK), pool)
        b.ids.append(int(logits[0].argmax()))
        a.ids.append(int(logits[1].argmax()))
    expected_a = hf_generate(hf, PROMPT, len(a.ids) - len(PROMPT))
    assert a.ids[len(PROMPT):] == expected_a
    assert b.ids[len(OTHER):] == hf_generate(hf, OTHER, new_tokens)
    assert len(set(expected_a)) > 3, "a continuation that repeats one token tells little"


def test_a_bf16_qwen_checkpoint_loaded_as_float32_matches_transformers(tmp_path):
    save_checkpoint(tmp_path, "qwen2.5", seed=3, dtype=torch.bfloat16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    model = TorchLlama.from_pretrained(tmp_path, device="cpu", dtype="float32")
    pool = model.new_kv_pool(num_blocks=8, block_size=BLOCK)
    last = model.forward(step_inputs([Chunk(PROMPT, [4, 6, 1, 3, 0])], BLOCK), pool)
    expected = hf_logits(hf, PROMPT)[-1]
    np.testing.assert_allclose(last[0].numpy(), expected, atol=2e-4 * np.abs(expected).max())


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_bfloat16_on_the_cpu_is_within_bf16_tolerance_of_transformers_in_float32(tmp_path, family):
    hf = save_checkpoint(tmp_path, family, seed=5)
    model = TorchLlama.from_pretrained(tmp_path, device="cpu", dtype=torch.bfloat16)
    pool = model.new_kv_pool(num_blocks=8, block_size=BLOCK)
    assert model.embed.dtype == pool.k[0].dtype == torch.bfloat16
    _, (every,) = model.forward_every(step_inputs([Chunk(PROMPT, [5, 1, 7, 0, 2])], BLOCK), pool, [0])
    expected = hf_logits(hf, PROMPT)
    assert every.dtype == torch.float32
    np.testing.assert_allclose(every.numpy(), expected, atol=BF16_TOLERANCE * np.abs(expected).max())


BF16_TOLERANCE = 0.05     # of the largest logit: bf16 keeps 8 bits of mantissa, two layers round ~20 times

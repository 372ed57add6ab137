"""The reference decoder on random checkpoints at the real sizes of the families it serves, beside transformers.

Per family: a random model of the real checkpoint's shape from transformers' `from_config`, saved in bfloat16
(as the hub ships them) to a temp dir and loaded by both; then the largest logit difference at every position
of a 32-token prompt (relative to the logits' scale), whether 16 greedy tokens agree, and single-sequence
decode speed after a 64-token prompt (the fastest of the timed steps: the machine is shared), ours and
transformers' (its own KV cache, torch's threads) in the same run. Needs torch and transformers (the `parity` extra).

    .venv/bin/python bench/families.py                       # smollm2-135m qwen2.5-0.5b qwen3-0.6b (~2 min, ~8 GB)
    .venv/bin/python bench/families.py --family llama3.2-1b  # also: tinyllama-1.1b (~5 GB of float32 weights each)
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from inferd.engine.reference import ForwardBatch, LlamaModel

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPES = {   # the published config.json of each, less what does not change the forward pass
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "llama3.2-1b": ("llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                  num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
                                  rope_parameters=LLAMA3_ROPE)),
    "tinyllama-1.1b": ("llama", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                     num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False)),
}
DEFAULT = ["smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b"]


def random_checkpoint(family: str, directory: Path):
    """The float32 transformers model of the bf16-rounded weights saved in `directory`."""
    model_type, fields = SHAPES[family]
    config = transformers.AutoConfig.for_model(model_type, max_position_embeddings=4096, rms_norm_eps=1e-6, **fields)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model.float()


def step(model: LlamaModel, kv, table: list[int], ids: list[int], start: int) -> np.ndarray:
    pos = np.arange(start, len(ids))
    return model.forward(ForwardBatch(token_ids=np.asarray(ids[start:]), positions=pos,
                                      slot_mapping=kv.slots_for_positions(table, pos), query_lens=[len(pos)],
                                      context_lens=[len(ids)], block_tables=[table]), kv)[0]


def ours_decode(model: LlamaModel, prompt: list[int], steps: int) -> tuple[list[int], float]:
    """Greedy tokens after `prompt`, and the fastest decode step in seconds."""
    kv = model.new_kv_cache(num_blocks=-(-(len(prompt) + steps) // 16), block_size=16)
    table, ids = list(range(kv.num_blocks)), list(prompt)
    logits, best = step(model, kv, table, ids, 0), float("inf")
    for _ in range(steps):
        ids.append(int(logits.argmax()))
        began = time.perf_counter()
        logits = step(model, kv, table, ids, len(ids) - 1)
        best = min(best, time.perf_counter() - began)
    return ids[len(prompt):], best


def theirs_decode(hf, prompt: list[int], steps: int) -> tuple[list[int], float]:
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        cache, ids, best = out.cache, list(prompt), float("inf")
        for _ in range(steps):
            ids.append(int(out.logits[0, -1].argmax()))
            began = time.perf_counter()
            out = hf(torch.tensor([[ids[-1]]]), cache=cache, use_cache=True)
            best = min(best, time.perf_counter() - began)
    return ids[len(prompt):], best


def run(family: str, steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hf = random_checkpoint(family, Path(tmp))
        model = LlamaModel.from_pretrained(Path(tmp))
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, 64).tolist()
    kv = model.new_kv_cache(num_blocks=2, block_size=16)
    ours = model.forward_every(ForwardBatch(token_ids=np.asarray(prompt[:32]), positions=np.arange(32),
                                            slot_mapping=np.arange(32), query_lens=[32], context_lens=[32],
                                            block_tables=[[0, 1]]), kv, [0])[1][0]
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt[:32]])).logits[0].numpy()
    print(f"{family} logits max abs diff / max abs logit: {np.abs(ours - theirs).max() / np.abs(theirs).max():.2e}")
    our_ids, our_step = ours_decode(model, prompt, steps)
    their_ids, their_step = theirs_decode(hf, prompt, steps)
    print(f"{family} greedy tokens equal: {our_ids == their_ids} ({steps} tokens)")
    print(f"{family} decode tokens/s ours: {1 / our_step:.1f}")
    print(f"{family} decode tokens/s transformers: {1 / their_step:.1f}")
    print(f"{family} ours / transformers: {their_step / our_step:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=sorted(SHAPES), help="repeatable; default: " +
                        " ".join(DEFAULT))
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    for family in args.family or DEFAULT:
        run(family, args.steps)


if __name__ == "__main__":
    main()

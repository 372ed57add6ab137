"""A model's next-token predictions and perplexity over fixed prompts: what a quantized version is held to.

Each prompt runs as one prefill through a scratch KV cache, with the logits at every position (the model's
`forward_every`); nothing else in the engine is involved.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferd.engine.reference.model import ForwardBatch, LlamaModel


def prompt_scores(model: LlamaModel, prompts: Sequence[Sequence[int]], block_size: int = 16) -> tuple[
        np.ndarray, np.ndarray, np.ndarray]:
    """(the argmax at every position but each prompt's last, the negative log-likelihood of the token that
    follows there, the argmax's lead over the runner-up in log-probability), concatenated over `prompts`
    (each at least 2 tokens)."""
    top, nll, lead = [], [], []
    for prompt in prompts:
        ids = np.asarray(prompt, dtype=np.int64)
        n = ids.size
        blocks = -(-n // block_size)
        kv = model.new_kv_cache(blocks, block_size)
        table = list(range(blocks))
        positions = np.arange(n)
        batch = ForwardBatch(token_ids=ids, positions=positions, slot_mapping=kv.slots_for_positions(table, positions),
                             query_lens=[n], context_lens=[n], block_tables=[table])
        _, (logits,) = model.forward_every(batch, kv, [0])
        logits = logits[:-1].astype(np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        top.append(logits.argmax(axis=1))
        nll.append(-log_probs[np.arange(n - 1), ids[1:]])
        two = np.partition(log_probs, -2, axis=1)[:, -2:]
        lead.append(two[:, 1] - two[:, 0])
    return np.concatenate(top), np.concatenate(nll), np.concatenate(lead)


def compare(reference: LlamaModel, candidate: LlamaModel, prompts: Sequence[Sequence[int]],
            lead: float = 0.1) -> tuple[float, float, float]:
    """(top-1 agreement of `candidate` with `reference`; the same where the reference's argmax leads its
    runner-up by more than `lead` nats, not a near-tie; candidate's perplexity / reference's) on `prompts`."""
    ref_top, ref_nll, ref_lead = prompt_scores(reference, prompts)
    top, nll, _ = prompt_scores(candidate, prompts)
    clear = ref_lead > lead
    return (float(np.mean(top == ref_top)), float(np.mean(top[clear] == ref_top[clear])) if clear.any() else 1.0,
            float(np.exp(nll.mean() - ref_nll.mean())))

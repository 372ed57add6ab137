"""Verification of draft tokens: which of them the target model keeps, and the token it adds after them.

The target ran once over a sequence's last token and its k drafts, which gives its logits at k + 1
positions: position j scores what follows draft j - 1. The rule is the standard one (Leviathan et al.,
"Fast Inference from Transformers via Speculative Decoding", 2023; vLLM's RejectionSampler,
vllm/v1/sample/rejection_sampler.py), so the output has the target's distribution whatever was drafted:
- greedy rows keep drafts while each equals the target's argmax there, then take the argmax at the first
  mismatch (or after the last draft): token for token what decoding without drafts gives;
- random rows keep draft j with probability min(1, p(d) / q(d)), p the target's distribution after the
  request's temperature, min-p, top-k and top-p (inferd.engine.reference.sampler.candidate_probs), q the
  drafter's (1 for the token a prompt lookup proposed); the first rejected one is replaced by a sample of
  the residual max(p - q, 0), renormalized; if none is rejected, one more token comes from p at the end.
Draws come from the sequence's own generator, so a seeded request gives the same output in any batch.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferd.types import SamplingParams


def verify_greedy(logits: np.ndarray, drafts: Sequence[int]) -> tuple[list[int], int]:
    """(drafts kept, the target's token after them) for a greedy row; `logits`: [len(drafts) + 1, vocab]."""
    return kept_by_argmax(np.argmax(logits, axis=1).tolist(), drafts)


def kept_by_argmax(best: Sequence[int], drafts: Sequence[int]) -> tuple[list[int], int]:
    """verify_greedy from the argmax at each position (a device computes it, only the ids cross over)."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == best[kept]:
        kept += 1
    return list(drafts[:kept]), best[kept]


def verify_sampled(logits: np.ndarray, drafts: Sequence[int], params: SamplingParams, rng: np.random.Generator,
                   draft_probs: np.ndarray | None = None) -> tuple[list[int], int]:
    """(drafts kept, the token after them) for a randomly sampled row. `draft_probs` ([len(drafts), vocab]):
    the drafter's distribution at each draft; None for a deterministic drafter (a prompt lookup)."""
    # here, not at the top: the reference package's runner imports this module
    from inferd.engine.reference.sampler import candidate_probs, sample_one

    for j, token in enumerate(drafts):
        ids, probs = candidate_probs(logits[j], params)
        at = np.flatnonzero(ids == token)
        p = float(probs[at[0]]) if at.size else 0.0
        q = 1.0 if draft_probs is None else float(draft_probs[j, token])
        if q > 0.0 and rng.random() < min(1.0, p / q):
            continue
        if draft_probs is None:
            residual = np.where(ids == token, 0.0, probs)
        else:
            residual = np.maximum(probs - draft_probs[j, ids], 0.0)
        total = residual.sum()
        if total <= 0.0:          # p and q agree everywhere (within rounding): p itself is the residual
            residual, total = probs, probs.sum()
        index = int(np.searchsorted(np.cumsum(residual / total), rng.random(), side="right"))
        return list(drafts[:j]), int(ids[min(index, ids.shape[0] - 1)])
    return list(drafts), sample_one(logits[len(drafts)], params, rng)


def verify_row(logits: np.ndarray, drafts: Sequence[int], params: SamplingParams, rng: np.random.Generator | None,
               draft_probs: np.ndarray | None = None) -> tuple[list[int], int]:
    """One row's drafts kept and the token after them, greedy or sampled as its params say."""
    if params.greedy:
        return verify_greedy(logits, drafts)
    if rng is None:
        raise ValueError("a randomly sampled row needs its generator")
    return verify_sampled(logits, drafts, params, rng, draft_probs)


def with_verified_drafts(result_tokens: list[int], sample_rows: Sequence[int], picked: Sequence,
                         draft_logits: dict[int, np.ndarray],
                         draft_probs: dict[int, np.ndarray | None] | None = None) -> list[list[int]]:
    """Verify each draft row (`draft_logits`: batch row -> its [draft + 1, vocab] logits; `draft_probs`: batch
    row -> the drafter's distributions, for a draft model's sampled guesses) of a step whose other rows were
    sampled already: its token in `result_tokens` replaced by the one after its kept drafts.
    Returns the kept drafts row by row of `sample_rows` ([] for rows without a draft)."""
    kept: list[list[int]] = []
    for j, (row, seq) in enumerate(zip(sample_rows, picked)):
        logits = draft_logits.get(row)
        if logits is None:
            kept.append([])
            continue
        q = draft_probs.get(row) if draft_probs else None
        drafts, result_tokens[j] = verify_row(logits, seq.draft, seq.sampling, seq.rng, q)
        kept.append(drafts)
    return kept

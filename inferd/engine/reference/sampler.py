"""Next-token choice per sequence: greedy (vectorized over the batch) or random sampling.

Random sampling draws from the sequence's own np.random.Generator, seeded from the request's
seed, exactly one uniform per token: a seeded request gives the same output whatever else
shares its batch. Order of filters: temperature, then top-k, then top-p (as HF and vLLM).
"""
from __future__ import annotations

import secrets
from collections.abc import Sequence as Seq

import numpy as np

from inferd.engine.validation import seed64
from inferd.types import SamplingParams, TokenLogprob


def make_rng(seed: int | None) -> np.random.Generator:
    """A sequence's generator: from the request seed, or from fresh entropy when unseeded.

    Any integer seed works (the API takes signed 64-bit ones; PCG64 refuses negatives): it is
    taken modulo 2**64, as every backend does, so -1 and 2**64 - 1 draw the same tokens.
    """
    return np.random.Generator(np.random.PCG64(seed64(seed) if seed is not None else secrets.randbits(64)))


def candidate_probs(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Token ids still allowed after temperature, top-k and top-p, and their probabilities.

    Candidates are ordered by descending logit (ties by token id) whenever a filter sorts them,
    by token id otherwise; probabilities sum to 1.
    """
    scaled = logits.astype(np.float64) / params.temperature
    vocab = scaled.shape[0]
    if 0 < params.top_k < vocab:
        top = np.argpartition(-scaled, params.top_k - 1)[:params.top_k]
        ids = top[np.lexsort((top, -scaled[top]))]
    elif params.top_p < 1.0:
        ids = np.argsort(-scaled, kind="stable")
    else:
        ids = np.arange(vocab)
    values = scaled[ids]
    probs = np.exp(values - values.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        # candidates are sorted here (by top-k or the argsort above):
        # keep the smallest head whose mass reaches top_p
        cumulative = np.cumsum(probs)
        keep = min(int(np.searchsorted(cumulative, params.top_p, side="left")) + 1, ids.shape[0])
        ids, probs = ids[:keep], probs[:keep]
        probs = probs / probs.sum()
    return ids, probs


def sample_one(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    ids, probs = candidate_probs(logits, params)
    u = rng.random()
    index = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(index, ids.shape[0] - 1)])


def token_logprobs(logits: np.ndarray, chosen: Seq[int], ks: Seq[int]) -> list[TokenLogprob]:
    """Row i's raw log-probability of token `chosen[i]` and its `ks[i]` most likely tokens (ties by id).

    Raw: log_softmax of the logits as the model gave them, before temperature, penalties and filters,
    as vLLM's default `logprobs_mode="raw_logprobs"` reports them (vllm/config/model.py). float64, so
    the values agree with transformers' float32 log_softmax to well under 1e-4. One vectorized pass for
    all rows: this runs every step for every row that asked.
    """
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    rows = np.arange(x.shape[0])
    own = x[rows, np.asarray(chosen, dtype=np.int64)].tolist()
    kmax = min(max(ks, default=0), x.shape[1])
    if kmax <= 0:
        return [TokenLogprob(int(t), v) for t, v in zip(chosen, own)]
    # k argmax passes, each masking what it found: already most likely first, ties by lowest id, and several
    # times faster than argpartition for k <= 20 at every vocabulary size measured (512 to 128k)
    ids = np.empty((x.shape[0], kmax), dtype=np.int64)
    vals = np.empty((x.shape[0], kmax))
    for j in range(kmax):
        best = x.argmax(axis=1)
        ids[:, j], vals[:, j] = best, x[rows, best]
        x[rows, best] = -np.inf
    return [TokenLogprob(int(t), v, tuple(zip(i[:k], w[:k])))
            for t, v, i, w, k in zip(chosen, own, ids.tolist(), vals.tolist(), ks)]


class Sampler:
    """Picks one token per row of `logits` ([rows, vocab] float32)."""

    def sample(self, logits: np.ndarray, params: Seq[SamplingParams],
               rngs: Seq[np.random.Generator | None]) -> list[int]:
        if logits.shape[0] != len(params):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(params)} sequences")
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if len(greedy) == len(params):
            return np.argmax(logits, axis=1).tolist()
        tokens = [0] * len(params)
        if greedy:
            for i, token in zip(greedy, np.argmax(logits[greedy], axis=1).tolist()):
                tokens[i] = token
        for i, p in enumerate(params):
            if not p.greedy:
                rng = rngs[i]
                if rng is None:
                    raise ValueError(f"row {i} samples randomly but has no generator")
                tokens[i] = sample_one(logits[i], p, rng)
        return tokens

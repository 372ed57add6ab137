"""Next-token choice per sequence: greedy (vectorized over the batch) or random sampling.

What each parameter means, and in what order, is vLLM's (v1) sampler, so a client sees what
vLLM would give it (vllm/v1/sample/sampler.py `Sampler.forward`/`sample`; the penalties are
vllm/model_executor/layers/utils.py `apply_penalties`; logit_bias and min_p are the built-in
LogitBiasLogitsProcessor and MinPLogitsProcessor of vllm/v1/sample/logits_processor/builtin.py):
1. `logit_bias` is added to the logits (a processor that can change the argmax, so before the rest);
2. penalties: `repetition_penalty` on every token of the prompt and the output so far (a positive
   logit is divided by it, a negative one multiplied), then `frequency_penalty` times the token's
   count in the output and `presence_penalty` once for a token in the output are subtracted;
3. greedy rows (temperature 0, or top_k 1) take the argmax of those logits;
4. temperature;
5. `min_p`: tokens less likely than min_p times the most likely one go;
6. top-k, then top-p.
Before all of them, a row with a grammar (SamplingParams.guided) has the tokens it does not allow set to
-inf (`grammar_masked`), greedy and random rows alike.

Random sampling draws from the sequence's own np.random.Generator, seeded from the request's
seed, exactly one uniform per token: a seeded request gives the same output whatever else
shares its batch. A batch none of whose rows sets a penalty or a bias pays nothing for them; a row that
does pays for the tokens it has seen, not for the vocabulary.
"""
from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence as Seq
from typing import Protocol

import numpy as np

from inferd.engine.validation import seed64
from inferd.types import SamplingParams, TokenLogprob


class Context(Protocol):
    """What the penalties read of a row (an engine's Sequence has both): its token ids so far, prompt
    then output, and how many of them are the prompt."""

    token_ids: Seq[int]
    num_prompt_tokens: int


def make_rng(seed: int | None) -> np.random.Generator:
    """A sequence's generator: from the request seed, or from fresh entropy when unseeded.

    Any integer seed works (the API takes signed 64-bit ones; PCG64 refuses negatives): it is
    taken modulo 2**64, as every backend does, so -1 and 2**64 - 1 draw the same tokens.
    """
    return np.random.Generator(np.random.PCG64(seed64(seed) if seed is not None else secrets.randbits(64)))


@functools.lru_cache(maxsize=1024)
def bias_arrays(bias: tuple[tuple[int, float], ...]) -> tuple[np.ndarray, np.ndarray]:
    """A request's logit_bias as index and value arrays: built once, not at every step."""
    return np.array([t for t, _ in bias], dtype=np.int64), np.array([b for _, b in bias], dtype=np.float64)


def adjust_logits(logits: np.ndarray, params: Seq[SamplingParams], contexts: Seq[Context],
                  rows: Seq[int] | None = None) -> np.ndarray:
    """`logits` ([rows, vocab]) with logit_bias added and the penalties applied to `rows` (default: every
    row), as a copy: the caller's stay as the model made them."""
    out = logits.copy()
    for r in range(len(params)) if rows is None else rows:
        adjust_row(out[r], params[r], contexts[r])
    return out


def adjust_row(row: np.ndarray, p: SamplingParams, context: Context) -> None:
    """One row's logit_bias and penalties, in place.

    vLLM builds a [rows, vocab] bin count and updates every logit; the same arithmetic on just the
    tokens a row has seen costs its context's length instead of the vocabulary's.
    """
    if p.logit_bias:
        ids, values = bias_arrays(p.logit_bias)
        row[ids] += values
    if p.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(context.token_ids, dtype=np.int64))
        values = row[seen]
        row[seen] = np.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if p.frequency_penalty or p.presence_penalty:
        token_ids, num_prompt = context.token_ids, context.num_prompt_tokens
        if len(token_ids) > num_prompt:
            ids, counts = np.unique(np.asarray(token_ids[num_prompt:], dtype=np.int64), return_counts=True)
            row[ids] -= p.frequency_penalty * counts + p.presence_penalty


def candidate_probs(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Token ids still allowed after temperature, min-p, top-k and top-p, and their probabilities.

    `logits` are one row after `adjust_logits`. Candidates are ordered by descending logit (ties
    by token id) whenever a filter sorts them, by token id otherwise; probabilities sum to 1.
    """
    scaled = logits.astype(np.float64) / params.temperature
    ids = np.arange(scaled.shape[0])
    if params.min_p > 0.0:
        # a token's probability over the most likely one's is exp(its scaled logit - the largest)
        ids = np.flatnonzero(np.exp(scaled - scaled.max()) >= params.min_p)
    values = scaled[ids]
    if 0 < params.top_k < ids.shape[0]:
        top = np.argpartition(-values, params.top_k - 1)[:params.top_k]
        order = top[np.lexsort((ids[top], -values[top]))]
        ids, values = ids[order], values[order]
    elif params.top_p < 1.0:
        order = np.argsort(-values, kind="stable")       # ids ascend, so ties stay in token-id order
        ids, values = ids[order], values[order]
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


def grammar_masked(logits: np.ndarray, rows: Seq) -> np.ndarray:
    """`logits` with each row whose sequence has a grammar masked by it, in place: tokens it does not allow
    next at -inf. vLLM's model runner applies xgrammar's bitmask the same way before its sampler, which
    takes raw log-probabilities from the masked logits, so a guided row's logprobs are those (a token the
    grammar forbids reports -inf, which the API clamps to -9999 as vLLM does). Rows without a grammar pay
    nothing."""
    for seq, row in zip(rows, logits):
        if seq.grammar is not None:
            if not seq.grammar.allowed().any():
                # A dead end (grammar.DEAD_END): the sequence fails alone. Its row stays finite, so sampling
                # it does no NaN arithmetic (which raised in the step and failed the whole batch).
                seq.grammar.failed = True
                row[:] = 0.0
            else:
                seq.grammar.mask(row)
    return logits


class Sampler:
    """Picks one token per row of `logits` ([rows, vocab] float32)."""

    def sample(self, logits: np.ndarray, params: Seq[SamplingParams], rngs: Seq[np.random.Generator | None],
               contexts: Seq[Context] | None = None) -> list[int]:
        """`contexts` (each row's token ids so far and prompt length; the engine passes its sequences)
        are read only when a row sets a penalty or a logit_bias."""
        if logits.shape[0] != len(params):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(params)} sequences")
        adjusted = [i for i, p in enumerate(params) if p.adjusts_logits]
        if adjusted:
            if contexts is None:
                raise ValueError("penalties and logit_bias need each row's token ids")
            logits = adjust_logits(logits, params, contexts, adjusted)
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

"""What one sampling step needs from the host, per row, gathered into arrays for one upload.

The rules are the reference sampler's (inferd.engine.reference.sampler): a row with a grammar is masked by
`GrammarState.allowed()` (a dead end, no token allowed, marks the grammar failed and zeroes the row);
logit_bias, then the repetition penalty over the prompt and output, then frequency and presence over the
output; greedy rows take the argmax; a random row draws exactly one uniform from its own generator, in row
order. Everything here is host work that grows with the rows and their contexts, never with the vocabulary
except a grammar row's mask (packed to bits, an eighth of the bytes).

A random row's candidates are ordered by token id unless a filter sorts them (top-p, or a top-k that drops
something), as the reference's `candidate_probs`. Whether top-k drops anything depends on how many tokens
min_p kept, which only the device knows: such a row ("maybe sorted") is drawn both ways and the device picks.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from inferd.engine.reference.sampler import bias_arrays
from inferd.types import SamplingParams


@dataclass
class SamplingPlan:
    """One step's host-side data: `arrays` go to the device in one upload; the rest steers the kernels."""

    rows: int
    vocab: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    greedy: int = 0                  # rows taking the argmax
    random: int = 0                  # rows drawing a token
    plain: int = 0                   # random rows drawn in token-id order
    sorted: int = 0                  # random rows drawn from candidates sorted by logit
    sorted_width: int = 0            # candidates the sorted rows keep (top-k's largest k, or the vocabulary)
    min_p: bool = False
    grammar: bool = False
    adjusts: bool = False            # some row has a logit_bias or a penalty
    repeats: bool = False            # some row has a repetition penalty
    counts: bool = False             # some row has a frequency or presence penalty and output to count
    penalty_tokens: int = 0          # tokens uploaded for the penalties
    logprob_rows: list[int] = field(default_factory=list)
    logprob_ks: list[int] = field(default_factory=list)

    @property
    def modifies_logits(self) -> bool:
        return self.grammar or self.adjusts


def plan(seqs: Sequence, vocab: int, topk_limit: int, history: TokenHistory) -> SamplingPlan:
    """The plan of one step over `seqs` (one per logits row). Sets `grammar.failed` on dead-end rows.
    `topk_limit`: the largest top-k drawn through a top-k selection rather than a full sort; `history`: the
    sampler's token arrays, for the penalties."""
    out = SamplingPlan(rows=len(seqs), vocab=vocab)
    params = [seq.sampling for seq in seqs]
    random_rows = [r for r, p in enumerate(params) if not p.greedy]
    out.random, out.greedy = len(random_rows), len(seqs) - len(random_rows)
    if random_rows:
        _random(out, [seqs[r] for r in random_rows], random_rows, topk_limit)
    _grammar(out, seqs)
    adjusted = [r for r, p in enumerate(params) if p.adjusts_logits]
    if adjusted:
        out.adjusts = True
        _adjustments(out, seqs, adjusted, history)
    history.step_done()
    out.logprob_rows = [r for r, p in enumerate(params) if p.logprobs is not None]
    out.logprob_ks = [params[r].logprobs for r in out.logprob_rows]
    if 0 < len(out.logprob_rows) < out.rows:
        out.arrays["logprob_rows"] = np.asarray(out.logprob_rows, dtype=np.int64)
    return out


def _random(out: SamplingPlan, seqs: list, rows: list[int], topk_limit: int) -> None:
    """The random rows' temperature, min_p, uniforms, and which of them draw in id or sorted order."""
    vocab = out.vocab
    params: list[SamplingParams] = [seq.sampling for seq in seqs]
    uniforms = np.empty(len(seqs))
    for i, seq in enumerate(seqs):
        if seq.rng is None:
            raise ValueError(f"row {rows[i]} samples randomly but has no generator")
        uniforms[i] = seq.rng.random()
    if out.greedy:
        out.arrays["random_rows"] = np.asarray(rows, dtype=np.int64)
    out.arrays["temperature"] = np.array([p.temperature for p in params], dtype=np.float32)
    min_p = np.array([p.min_p for p in params], dtype=np.float32)
    if (min_p > 0).any():
        out.min_p = True
        out.arrays["min_p"] = min_p
    top_k = np.array([p.top_k if 0 < p.top_k < vocab else 0 for p in params], dtype=np.int64)
    top_p = np.array([p.top_p for p in params], dtype=np.float64)
    surely_sorted = (top_p < 1.0) | ((min_p <= 0) & (top_k > 0))
    maybe_sorted = ~surely_sorted & (top_k > 0)        # min_p decides whether top-k drops anything
    plain = np.flatnonzero(~surely_sorted)
    ranked = np.flatnonzero(surely_sorted | maybe_sorted)
    out.plain, out.sorted = len(plain), len(ranked)
    if out.plain:
        if out.plain < out.random:
            out.arrays["plain_rows"] = plain
        out.arrays["plain_u"] = uniforms[plain]
    if out.sorted:
        if out.sorted < out.random:
            out.arrays["sorted_rows"] = ranked
        out.arrays["sorted_u"] = uniforms[ranked]
        out.arrays["sorted_top_k"] = top_k[ranked]
        out.arrays["sorted_top_p"] = top_p[ranked]
        if maybe_sorted.any():
            out.arrays["sorted_maybe"] = maybe_sorted[ranked]
        widest = int(top_k[ranked].max())
        out.sorted_width = widest if (top_k[ranked] > 0).all() and widest <= topk_limit else vocab


def _grammar(out: SamplingPlan, seqs: Sequence) -> None:
    """Grammar rows' allowed tokens as bits (little-endian, `vocab` wide; ids past a grammar's own vocabulary
    are not allowed), and the dead ends."""
    masked, bits, dead = [], [], []
    width = (out.vocab + 7) // 8
    for r, seq in enumerate(seqs):
        if seq.grammar is None:
            continue
        allowed = seq.grammar.allowed()
        if not allowed.any():
            # A dead end (grammar.DEAD_END): the sequence fails alone; its row is zeroed, so it stays finite
            seq.grammar.failed = True
            dead.append(r)
            continue
        packed = np.zeros(width, dtype=np.uint8)
        row = np.packbits(allowed[:out.vocab], bitorder="little")
        packed[:row.shape[0]] = row
        masked.append(r)
        bits.append(packed)
    if masked:
        out.arrays["grammar_rows"] = np.asarray(masked, dtype=np.int64)
        out.arrays["grammar_bits"] = np.stack(bits)
    if dead:
        out.arrays["dead_rows"] = np.asarray(dead, dtype=np.int64)
    out.grammar = bool(masked or dead)


class TokenHistory:
    """Each sampled sequence's token ids as an int32 array, carried from step to step and extended by what the
    sequence appended since: reading a long context from its Python list at every step would cost the host
    more than the device spends sampling. Holds only the sequences of the latest step."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[object, np.ndarray, int]] = {}     # id(seq) -> (seq, buffer, tokens in it)
        self._next: dict[int, tuple[object, np.ndarray, int]] = {}

    def tokens(self, seq, vocab: int) -> np.ndarray:
        """`seq.token_ids` as an int32 array (valid until the step after next); ids must lie in [0, vocab)."""
        ids, n = seq.token_ids, len(seq.token_ids)
        entry = self._held.get(id(seq)) or self._next.get(id(seq))
        if entry is None or entry[0] is not seq or entry[2] > n:     # a strong reference: an id is never reused
            buffer, have = np.empty(max(2 * n, 64), dtype=np.int32), 0
        else:
            _, buffer, have = entry
            if n > buffer.shape[0]:
                grown = np.empty(2 * n, dtype=np.int32)
                grown[:have] = buffer[:have]
                buffer = grown
        if n > have:
            buffer[have:n] = _in_vocab(np.asarray(ids[have:n], dtype=np.int64), vocab)
        self._next[id(seq)] = (seq, buffer, n)
        return buffer[:n]

    def step_done(self) -> None:
        """Forget the sequences the step just planned did not sample."""
        self._held, self._next = self._next, {}


def _adjustments(out: SamplingPlan, seqs: Sequence, rows: list[int], history: TokenHistory) -> None:
    """The bias of `rows` as flat indices (row * vocab + token) and values; for the penalties, each penalised
    row's tokens (all of them for the repetition penalty, its output for frequency and presence alone), which
    the device turns into flat indices and counts: a row pays for the tokens it has seen, not the vocabulary."""
    vocab = out.vocab
    bias_at, bias, pen_rows, chunks, firsts = [], [], [], [], []
    for r in rows:
        p, seq = seqs[r].sampling, seqs[r]
        if p.logit_bias:
            ids, values = bias_arrays(p.logit_bias)
            bias_at.append(r * vocab + _in_vocab(ids, vocab))
            bias.append(values)
        counting = bool(p.frequency_penalty or p.presence_penalty) and len(seq.token_ids) > seq.num_prompt_tokens
        if p.repetition_penalty != 1.0 or counting:
            first = 0 if p.repetition_penalty != 1.0 else seq.num_prompt_tokens
            out.repeats = out.repeats or p.repetition_penalty != 1.0
            out.counts = out.counts or counting
            pen_rows.append(r)
            chunks.append(history.tokens(seq, vocab)[first:])
            firsts.append(first)
    if bias_at:
        out.arrays["bias_at"], out.arrays["bias"] = np.concatenate(bias_at), np.concatenate(bias)
    if pen_rows:
        penalised = [seqs[r] for r in pen_rows]
        out.penalty_tokens = sum(chunk.shape[0] for chunk in chunks)
        out.arrays.update(
            pen_rows=np.asarray(pen_rows, dtype=np.int64), pen_tokens=np.concatenate(chunks),
            pen_lens=np.array([chunk.shape[0] for chunk in chunks], dtype=np.int64),
            pen_first=np.asarray(firsts, dtype=np.int64),
            pen_prompt=np.array([seq.num_prompt_tokens for seq in penalised], dtype=np.int64),
            pen_repeat=np.array([seq.sampling.repetition_penalty for seq in penalised], dtype=np.float32),
            pen_freq=np.array([seq.sampling.frequency_penalty for seq in penalised], dtype=np.float64),
            pen_presence=np.array([seq.sampling.presence_penalty for seq in penalised], dtype=np.float64))


def _in_vocab(ids: np.ndarray, vocab: int) -> np.ndarray:
    """`ids` when all lie in the logits' width: a stray id would index out of bounds on the device, which CUDA
    reports as an assertion that ends the process, not as an error."""
    if ids.shape[0] and (ids.min() < 0 or ids.max() >= vocab):
        stray = int(ids.max() if ids.max() >= vocab else ids.min())
        raise ValueError(f"token id {stray} is outside the vocabulary [0, {vocab})")
    return ids

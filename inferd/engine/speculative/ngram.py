"""Prompt lookup (n-gram) drafting: guess a sequence's next tokens from its own context.

When the last n tokens of a sequence (prompt and output so far) occurred earlier in it, the tokens that
followed them then are proposed as the next ones: what a model editing code or summarizing a document
does when it copies a span of its prompt. The longest n in [min_n, max_n] with a match wins, and of its
matches the latest (the most recent context is the likeliest to repeat), as vLLM's NgramProposer
(vllm/v1/spec_decode/ngram_proposer.py) looks for the longest match. No model runs: a proposal costs one
vectorized comparison over the sequence's last `max_lookback` tokens, then work per earlier occurrence of
its last token.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class NgramProposer:
    """Proposes up to k tokens from the latest earlier occurrence of a sequence's longest matching suffix."""

    def __init__(self, *, min_n: int, max_n: int, max_lookback: int = 4096) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.max_lookback = max_lookback        # tokens searched, counted back from the end: a bounded cost

    def propose(self, token_ids: Sequence[int] | np.ndarray, k: int) -> list[int]:
        """Up to `k` draft tokens for what follows `token_ids` ([] when no suffix of at least min_n tokens
        occurred before)."""
        if k < 1 or len(token_ids) <= self.min_n:
            return []
        tokens = np.asarray(token_ids[-self.max_lookback:], dtype=np.int64)
        length = tokens.shape[0]
        # Where the last token occurred before (each an n-gram match of length 1 ending there), then how far
        # back each of those matches the suffix: one pass over the tokens, then work only per candidate.
        ends = np.flatnonzero(tokens[:length - 1] == tokens[length - 1])
        matched = np.ones(ends.shape[0], dtype=np.int64)
        for back in range(1, min(self.max_n, length - 1)):
            alive = (matched == back) & (ends >= back)
            if not alive.any():
                break
            alive[alive] = tokens[ends[alive] - back] == tokens[length - 1 - back]
            matched[alive] += 1
        good = np.flatnonzero(matched >= self.min_n)
        if good.size == 0:
            return []
        best = matched[good].max()
        end = int(ends[good[matched[good] == best][-1]])      # the latest of the longest matches
        return tokens[end + 1:end + 1 + k].tolist()

    def propose_all(self, seqs: Sequence, ks: Sequence[int]) -> list[list[int]]:
        """`propose` for each sequence (engine Sequences: their token_ids) with its own k."""
        return [self.propose(token_array(seq), k) for seq, k in zip(seqs, ks)]


def token_array(seq) -> np.ndarray:
    """seq.token_ids as int64, kept on the sequence and grown by what was appended since (a sequence's tokens
    only grow while it runs), so a step converts its few new tokens, not the whole context."""
    held = seq.token_array
    count = len(seq.token_ids)
    if held is None or held[1] > count:
        held = (np.empty(max(64, 2 * count), dtype=np.int64), 0)
    buf, filled = held
    if count > buf.shape[0]:
        grown = np.empty(2 * count, dtype=np.int64)
        grown[:filled] = buf[:filled]
        buf = grown
    if count > filled:
        buf[filled:count] = seq.token_ids[filled:count]
    seq.token_array = (buf, count)
    return buf[:count]

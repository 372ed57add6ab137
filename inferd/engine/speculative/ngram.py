"""Prompt lookup (n-gram) drafting: guess a sequence's next tokens from its own context.

When the last n tokens of a sequence (prompt and output so far) occurred earlier in it, the tokens that
followed them then are proposed as the next ones: what a model editing code or summarizing a document
does when it copies a span of its prompt. The longest n in [min_n, max_n] with a match wins, and of its
matches the latest (the most recent context is the likeliest to repeat), as vLLM's NgramProposer
(vllm/v1/spec_decode/ngram_proposer.py) looks for the longest match. No model runs: a proposal costs one
vectorized scan of the sequence's tokens, a few microseconds per thousand tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Proposes up to k tokens from the latest earlier occurrence of a sequence's longest matching suffix."""

    def __init__(self, *, min_n: int, max_n: int, max_lookback: int = 4096) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.max_lookback = max_lookback        # tokens searched, counted back from the end: a bounded cost

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to `k` draft tokens for what follows `token_ids` ([] when no suffix of at least min_n tokens
        occurred before)."""
        if k < 1 or len(token_ids) <= self.min_n:
            return []
        tokens = np.asarray(token_ids[-self.max_lookback:], dtype=np.int64)
        length = tokens.shape[0]
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # windows starting at 0 .. length - n - 1: every earlier n-gram, none of them the suffix itself
            windows = sliding_window_view(tokens[:length - 1], n)
            hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start:start + k].tolist()
        return []

    def propose_all(self, seqs: Sequence, ks: Sequence[int]) -> list[list[int]]:
        """`propose` for each sequence (engine Sequences: their token_ids) with its own k."""
        return [self.propose(seq.token_ids, k) for seq, k in zip(seqs, ks)]

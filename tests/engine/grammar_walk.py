"""A stand-in model for grammar tests: random logits under a grammar's mask, biased the way a trained
model is, so that output ends (test_grammar.py, test_grammar_fuzz.py).

Pure random logits never end a JSON string or array: the closing quote is one token in thousands. So the
walk adds a bias a model has, and the mask keeps it honest (every token is one the grammar allows):
a stop token wins whenever the grammar allows one (the output is complete); `"`, `}` and `]` gain
0.1 per step taken, `,` half that (so a number or a required property moves on, but an array prefers
to close). Greedy over the result; seeded, so a test is repeatable.
"""
from __future__ import annotations

import numpy as np

from inferd.engine.grammar import GrammarState
from inferd.engine.sim.profiles import SimTokenizer


class Walk:
    def __init__(self, tokenizer: SimTokenizer) -> None:
        pieces = tokenizer.token_bytes()
        self.tokenizer, self.size = tokenizer, tokenizer.vocab_size
        self.weight = np.zeros(self.size)
        for tid, piece in enumerate(pieces):
            self.weight[tid] = {b'"': 1.0, b"}": 1.0, b"]": 1.0, b",": 0.5}.get(piece, 0.0)
        self.stops = list(tokenizer.eos_token_ids)

    def tokens(self, state: GrammarState, seed: int = 0, limit: int = 3000) -> list[int] | None:
        """The walk's tokens until the grammar ends (without the stop token); None past `limit` tokens."""
        rng, out = np.random.default_rng(seed), []
        while not state.terminated:
            if len(out) >= limit:
                return None
            row = rng.standard_normal(self.size) + self.weight * (0.1 * len(out))
            row[self.stops] += 1000.0
            state.mask(row)
            token = int(row.argmax())
            assert state.accept(token), "the mask allowed a token the grammar refuses"
            out.append(token)
        return out[:-1]

    def text(self, state: GrammarState, seed: int = 0, limit: int = 3000) -> str | None:
        tokens = self.tokens(state, seed, limit)
        return None if tokens is None else self.tokenizer.decode(tokens)

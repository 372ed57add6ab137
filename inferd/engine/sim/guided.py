"""The sim's structured output: its synthetic tokens obey the request's grammar, so load tests of
structured output are honest (the same mask work per token as a real engine's sampler, and output that parses).

The vocabulary xgrammar sees is the sim tokenizer's own (each id's bytes, VocabType.RAW; specials are
empty, so no grammar ever allows them inside text). Among the tokens the grammar allows next, the choice
is a deterministic function of (sequence key, position), like the free-running sim's, with a bias a model
would have: it stops as soon as the grammar may end; it writes the sim's words where the grammar allows
them (inside strings); and the longer the output, the more it prefers a token that closes something
(`"`, `}`, `]`), from 5% at the first token to 90% from the 85th, so strings, arrays and objects end
after a few dozen tokens rather than at max_tokens. Every token it picks is one the grammar allows.
"""
from __future__ import annotations

import numpy as np

from inferd.engine.grammar import GrammarState, Grammars
from inferd.engine.sim.profiles import SimTokenizer

_CLOSERS = ('"', "}", "]")


def sim_grammars(tokenizer: SimTokenizer) -> Grammars:
    """Grammars over the sim tokenizer's vocabulary (xgrammar loads on the first compile)."""
    return Grammars.for_pieces(tokenizer.token_bytes(), tokenizer.eos_token_ids, tokenizer.vocab_size)


class GuidedChooser:
    """Picks the next synthetic token of a sequence with a grammar."""

    def __init__(self, tokenizer: SimTokenizer) -> None:
        size = tokenizer.vocab_size
        self._stops = np.asarray(tokenizer.eos_token_ids, dtype=np.int64)
        self._words = np.zeros(size, dtype=bool)
        self._words[list(tokenizer.generation_ids)] = True
        self._pieces = np.zeros(size, dtype=bool)              # tokens with text of their own (not bytes, specials)
        self._pieces[tokenizer.first_piece:] = True
        self._closers = [tokenizer.token_to_id(c) for c in _CLOSERS]

    def choose(self, grammar: GrammarState, key: int, pos: int) -> int | None:
        """The token at output position `pos` (None: the grammar allows nothing, it cannot go on)."""
        allowed = grammar.allowed()
        if allowed[self._stops].any():
            return int(self._stops[allowed[self._stops]][0])     # the output is complete: end it
        h = hash((key, pos, 3))
        if h % 100 < min(90, 5 + pos):
            for closer in self._closers:
                if allowed[closer]:
                    return closer
        words = np.flatnonzero(allowed & self._words)
        if len(words) and (h >> 8) % 4:
            return int(words[(h >> 10) % len(words)])
        ids = np.flatnonzero(allowed & self._pieces)
        if not len(ids):
            ids = np.flatnonzero(allowed)      # only raw bytes (say, a regex asking for non-ASCII text)
        return int(ids[(h >> 10) % len(ids)]) if len(ids) else None

"""Synthetic log-probabilities for the sim: well-formed, deterministic, and meaningless.

Each position's values are a function of the sequence's output key (or its prompt) and the position,
so the same request gets the same values. Well-formed as a model's would be: every value negative, the
alternatives sorted most likely first with the scored token first among them at its own value, and the
listed probabilities summing to under 1. docs/sim.md says they are synthetic.
"""
from __future__ import annotations

from collections.abc import Sequence

from inferd.types import TokenLogprob


def synthetic_logprob(key: int, pos: int, token: int, k: int, vocab: Sequence[int]) -> TokenLogprob:
    """`token` at position `pos`: a logprob in [-2, -0.7] (probability under 1/2) and k alternatives
    (itself first, then others each at least 1 nat below it, 0.5 nat apart: their mass stays under 1)."""
    value = -0.7 - (hash((key, pos, 3)) % 1300) / 1000.0
    if k <= 0:
        return TokenLogprob(token, value)
    top = [(token, value)]
    start = hash((key, pos, 4))
    i = 0
    while len(top) < k and i < len(vocab):
        other = vocab[(start + i) % len(vocab)]
        i += 1
        if other != token:
            top.append((other, value - 1.0 - 0.5 * (len(top) - 1)))
    return TokenLogprob(token, value, tuple(top))


def synthetic_prompt_logprobs(prompt: Sequence[int], k: int, vocab: Sequence[int]) -> list[TokenLogprob | None]:
    """Every prompt token's after the first (None: it has no context), keyed by the prompt."""
    key = hash(tuple(prompt))
    return [None] + [synthetic_logprob(key, -i, prompt[i], k, vocab) for i in range(1, len(prompt))]

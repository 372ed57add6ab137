"""Prompts for the copying model (inferd.artifacts.build.copying; the `copying_model` fixture builds it)."""
from __future__ import annotations

import numpy as np


def copying_prompts(successor: np.ndarray) -> list[list[int]]:
    """Spans of the copying model's successor chain, then filler, then a token from inside the span: its
    output copies the rest of the span (what a prompt lookup finds), or runs off it (the last two)."""
    prompts = []
    vocab = successor.shape[0]
    for i, start in enumerate((5, 77, 300, 12, 450, 31)):
        span = [start % vocab]
        for _ in range(60):
            span.append(int(successor[span[-1]]))
        tail = span[3 * i + 2] if i < 4 else (i * 37) % vocab       # the last two resume off the span
        prompts.append(span + [7, 8, 9] + [tail])
    return prompts

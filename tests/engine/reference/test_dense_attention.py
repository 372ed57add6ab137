"""Dense causal attention over packed sequences, against a direct implementation."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.reference import dense_attention
from inferd.engine.reference.dense_attention import causal_attention

HEADS, KV_HEADS, DIM = 4, 2, 8


def direct(q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths: list[int]) -> np.ndarray:
    """Sequence by sequence, KV heads repeated, float64, masked softmax written out."""
    out, start = [], 0
    for n in lengths:
        qs, ks, vs = (a[start:start + n].astype(np.float64) for a in (q, k, v))
        ks, vs = (np.repeat(a, HEADS // KV_HEADS, axis=1) for a in (ks, vs))
        scores = np.einsum("ihd,jhd->hij", qs, ks)
        scores[:, np.triu(np.ones((n, n), bool), 1)] = -np.inf
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out.append(np.einsum("hij,jhd->ihd", probs, vs))
        start += n
    return np.concatenate(out)


def random_qkv(lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    total = sum(lengths)
    return (rng.standard_normal((total, HEADS, DIM), dtype=np.float32),
            rng.standard_normal((total, KV_HEADS, DIM), dtype=np.float32),
            rng.standard_normal((total, KV_HEADS, DIM), dtype=np.float32))


def test_each_query_attends_to_its_own_sequence_up_to_its_position() -> None:
    lengths = [1, 5, 17, 2]
    q, k, v = random_qkv(lengths)
    got = causal_attention(q, k, v, lengths)
    assert got.shape == q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, direct(q, k, v, lengths), atol=1e-5)


def test_queries_taken_in_small_chunks_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths = [9, 23]
    q, k, v = random_qkv(lengths)
    whole = causal_attention(q, k, v, lengths)
    monkeypatch.setattr(dense_attention, "_SCORES_BYTES", 4 * HEADS * 23 * 3)    # 3 query rows at a time
    np.testing.assert_allclose(causal_attention(q, k, v, lengths), whole, atol=1e-6)

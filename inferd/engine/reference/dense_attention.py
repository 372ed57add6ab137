"""Causal self-attention over whole sequences packed one after another, without a KV cache.

What an encoder-style pass (embeddings) needs: every sequence attends to its own tokens only, each
query to the keys at and before its position. Queries go in chunks so the scores never exceed about
`_SCORES_BYTES`, whatever the sequence length.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferd.engine.reference.kv_cache import _softmax_inplace

_SCORES_BYTES = 64 << 20


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    """`q` [T, num_heads, head_dim] (already scaled by 1/sqrt(head_dim)), `k`, `v` [T, num_kv_heads, head_dim],
    T = sum(lengths), sequences packed in order. Returns [T, num_heads, head_dim].

    Grouped-query attention: query head h reads KV head h // (num_heads // num_kv_heads), as if the KV
    heads were repeated.
    """
    num_heads, head_dim = q.shape[1:]
    num_kv = k.shape[1]
    group = num_heads // num_kv
    out = np.empty_like(q)
    start = 0
    for length in lengths:
        end = start + length
        chunk = max(1, _SCORES_BYTES // (4 * num_heads * length))
        keys = k[start:end].transpose(1, 2, 0)[:, None]                    # [kv, 1, D, n]
        values = v[start:end].transpose(1, 0, 2)[:, None]                  # [kv, 1, n, D]
        for first in range(0, length, chunk):
            last = min(first + chunk, length)                              # queries first..last-1
            rows = q[start + first:start + last].reshape(last - first, num_kv, group, head_dim)
            scores = np.matmul(rows.transpose(1, 2, 0, 3), keys[..., :last])    # [kv, G, rows, keys]
            future = np.arange(last)[None, :] > np.arange(first, last)[:, None]
            scores[..., future] = -np.inf
            probs = _softmax_inplace(scores)
            ctx = np.matmul(probs, values[:, :, :last])                        # [kv, G, rows, D]
            out[start + first:start + last] = ctx.transpose(2, 0, 1, 3).reshape(last - first, num_heads, head_dim)
        start = end
    return out

"""Paged KV storage and paged attention against a dense reference."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.reference import kv_cache
from inferd.engine.reference.kv_cache import AttentionPlan, KVCacheError, PagedKVCache, paged_attention

NUM_HEADS, NUM_KV, HEAD_DIM, BLOCK = 6, 2, 8, 4


def make_cache(num_blocks: int = 40, num_layers: int = 1) -> PagedKVCache:
    return PagedKVCache(num_layers=num_layers, num_blocks=num_blocks, block_size=BLOCK,
                        num_kv_heads=NUM_KV, head_dim=HEAD_DIM)


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, first_pos: int) -> np.ndarray:
    """Plain causal GQA softmax attention: q [n, H, D] at positions first_pos.., k/v [C, KV, D]."""
    group = NUM_HEADS // NUM_KV
    out = np.zeros_like(q)
    for i in range(q.shape[0]):
        visible = first_pos + i + 1
        for h in range(NUM_HEADS):
            scores = k[:visible, h // group] @ q[i, h]
            weights = np.exp(scores - scores.max())
            out[i, h] = (weights / weights.sum()) @ v[:visible, h // group]
    return out


def decode_step(rng: np.random.Generator, cache: PagedKVCache,
                lengths: list[int]) -> tuple[AttentionPlan, list[np.ndarray], list[np.ndarray]]:
    """One decode step over random sequences of `lengths` in shuffled blocks: the plan, each sequence's
    query and its dense-attention result."""
    free = rng.permutation(cache.num_blocks).tolist()
    tables, queries, expected = [], [], []
    for length in lengths:
        table = [free.pop() for _ in range(-(-length // BLOCK))]
        k, v = rng.standard_normal((2, length, NUM_KV, HEAD_DIM)).astype(np.float32)
        q = rng.standard_normal((1, NUM_HEADS, HEAD_DIM)).astype(np.float32)
        cache.write(0, cache.slots_for_positions(table, np.arange(length)), k, v)
        tables.append(table)
        queries.append(q)
        expected.append(dense_attention(q, k, v, length - 1))
    plan = AttentionPlan(cache, [1] * len(lengths), lengths, tables)
    return plan, queries, expected


def test_write_then_gather_returns_what_was_written_at_those_slots():
    cache = make_cache(num_layers=2)
    rng = np.random.default_rng(0)
    slots = np.array([17, 3, 42])
    k, v = rng.standard_normal((2, 3, NUM_KV, HEAD_DIM)).astype(np.float32)
    cache.write(1, slots, k, v)
    got_k, got_v = cache.gather(1, slots)
    np.testing.assert_array_equal(got_k, k)
    np.testing.assert_array_equal(got_v, v)
    assert not cache.k[0].any(), "other layers stay untouched"


def test_slots_for_positions_follow_the_block_table():
    cache = make_cache()
    slots = cache.slots_for_positions([7, 2, 9], np.array([0, 3, 4, 9]))
    assert slots.tolist() == [7 * BLOCK, 7 * BLOCK + 3, 2 * BLOCK, 9 * BLOCK + 1]


def test_slots_for_positions_beyond_the_table_raise():
    with pytest.raises(KVCacheError, match="blocks"):
        make_cache().slots_for_positions([1], np.array([BLOCK]))


def test_block_ids_outside_the_cache_raise():
    with pytest.raises(KVCacheError, match="block ids"):
        make_cache(num_blocks=8).block_array([[3, 8]], [BLOCK + 1])


def test_block_table_too_short_for_its_context_raises():
    with pytest.raises(KVCacheError, match="needs 2 blocks"):
        make_cache().block_array([[3]], [BLOCK + 1])


def test_plan_rejects_query_longer_than_context():
    with pytest.raises(KVCacheError, match="query_len"):
        AttentionPlan(make_cache(), [3], [2], [[0]])


def test_paged_attention_equals_dense_attention_for_mixed_prefill_chunks_and_decodes():
    """Sequences own shuffled blocks; one step mixes decodes, a first chunk and a later chunk."""
    rng = np.random.default_rng(1)
    cache = make_cache(num_blocks=40)
    # (context_len after this step, query_len this step)
    shapes = [(9, 1), (5, 5), (14, 6), (1, 1), (23, 1), (12, 3)]
    free = rng.permutation(cache.num_blocks).tolist()
    tables, contexts, queries, expected = [], [], [], []
    for context_len, query_len in shapes:
        table = [free.pop() for _ in range(-(-context_len // BLOCK) + 1)]   # one spare block
        k, v = rng.standard_normal((2, context_len, NUM_KV, HEAD_DIM)).astype(np.float32)
        q = rng.standard_normal((query_len, NUM_HEADS, HEAD_DIM)).astype(np.float32)
        cache.write(0, cache.slots_for_positions(table, np.arange(context_len)), k, v)
        tables.append(table)
        queries.append(q)
        expected.append(dense_attention(q, k, v, context_len - query_len))
    plan = AttentionPlan(cache, [s[1] for s in shapes], [s[0] for s in shapes], tables)

    out = paged_attention(cache, 0, np.concatenate(queries), plan)

    np.testing.assert_allclose(out, np.concatenate(expected), atol=1e-5)
    assert plan.last_rows.tolist() == (np.cumsum([s[1] for s in shapes]) - 1).tolist()


def test_decodes_of_very_different_lengths_split_into_groups_and_still_equal_dense_attention():
    rng = np.random.default_rng(2)
    cache = make_cache(num_blocks=200)
    lengths = [3, 300, 7, 290, 2, 150]
    plan, queries, expected = decode_step(rng, cache, lengths)

    out = paged_attention(cache, 0, np.concatenate(queries), plan)

    assert len(plan.decode_groups) > 1
    assert sorted(int(r) for g in plan.decode_groups for r in g.rows) == list(range(len(lengths)))
    np.testing.assert_allclose(out, np.concatenate(expected), atol=1e-5)


def test_plan_slots_of_new_tokens_sit_at_the_end_of_each_context():
    cache = make_cache()
    plan = AttentionPlan(cache, [2, 1], [6, 3], [[5, 1], [8]])
    assert plan.token_slots.tolist() == [1 * BLOCK + 0, 1 * BLOCK + 1, 8 * BLOCK + 2]


def test_matmul_fallbacks_compute_what_matvec_and_vecmat_do():
    """Older NumPy (no np.matvec/np.vecmat, added in 2.2) gets the same products, broadcast as in decode."""
    rng = np.random.default_rng(3)
    k = rng.standard_normal((3, NUM_KV, 1, 10, HEAD_DIM)).astype(np.float32)   # [S, kv, 1, L, D]
    q = rng.standard_normal((3, NUM_KV, 3, HEAD_DIM)).astype(np.float32)       # [S, kv, G, D]
    p = rng.standard_normal((3, NUM_KV, 3, 10)).astype(np.float32)             # [S, kv, G, L]

    scores = kv_cache._matvec_by_matmul(k, q)
    mixed = kv_cache._vecmat_by_matmul(p, k)

    np.testing.assert_allclose(scores, np.einsum("skxld,skgd->skgl", k, q), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mixed, np.einsum("skgl,skxld->skgd", p, k), rtol=1e-5, atol=1e-5)
    if hasattr(np, "matvec"):
        np.testing.assert_allclose(scores, np.matvec(k, q), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mixed, np.vecmat(p, k), rtol=1e-5, atol=1e-5)


def test_decode_attention_on_the_matmul_fallback_equals_the_default_path(monkeypatch):
    rng = np.random.default_rng(4)
    cache = make_cache(num_blocks=200)
    lengths = [5, 300, 9, 1]
    plan, queries, expected = decode_step(rng, cache, lengths)
    default = paged_attention(cache, 0, np.concatenate(queries), plan)

    monkeypatch.setattr(kv_cache, "_matvec", kv_cache._matvec_by_matmul)
    monkeypatch.setattr(kv_cache, "_vecmat", kv_cache._vecmat_by_matmul)
    fallback = paged_attention(cache, 0, np.concatenate(queries), plan)

    np.testing.assert_allclose(fallback, default, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fallback, np.concatenate(expected), atol=1e-5)

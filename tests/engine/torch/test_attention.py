"""Paged attention in torch against plain dense attention: decode rows (the kernel contract, padding rows
included) and prefill chunks with and without a cached prefix, grouped-query, blocks in any order."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from inferd.engine.torch.attention import decode_attention_for, prefill_attention, sdpa_paged_decode

HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS = 6, 2, 8, 4, 12


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_pos: int) -> torch.Tensor:
    """Causal GQA softmax attention, one head at a time: q [n, H, D] at positions first_pos.., k/v [C, KV, D]."""
    group = HEADS // KV_HEADS
    out = torch.zeros_like(q)
    for i in range(q.shape[0]):
        visible = first_pos + i + 1
        for h in range(HEADS):
            scores = k[:visible, h // group] @ q[i, h] / math.sqrt(HEAD_DIM)
            out[i, h] = torch.softmax(scores, dim=0) @ v[:visible, h // group]
    return out


def pool_with(contexts: list[torch.Tensor], tables: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """k_cache, v_cache [BLOCKS + 1, BLOCK, KV, D] holding each context ([2, C, KV, D]) in its blocks."""
    k_cache = torch.randn(BLOCKS + 1, BLOCK, KV_HEADS, HEAD_DIM)     # noise where nothing was written
    v_cache = torch.randn(BLOCKS + 1, BLOCK, KV_HEADS, HEAD_DIM)
    for (k, v), table in zip(contexts, tables):
        for pos in range(k.shape[0]):
            k_cache[table[pos // BLOCK], pos % BLOCK] = k[pos]
            v_cache[table[pos // BLOCK], pos % BLOCK] = v[pos]
    return k_cache, v_cache


def test_sdpa_paged_decode_keeps_the_kernel_contract_and_zeroes_padding_rows():
    torch.manual_seed(0)
    lengths, tables = [7, 1, 12], [[9, 2], [5], [0, 11, 3]]
    contexts = [torch.randn(2, n, KV_HEADS, HEAD_DIM) for n in lengths]
    k_cache, v_cache = pool_with(contexts, tables)
    q = torch.randn(4, HEADS, HEAD_DIM)
    block_tables = torch.tensor([t + [0] * (3 - len(t)) for t in tables] + [[0, 0, 0]], dtype=torch.int32)
    context_lens = torch.tensor(lengths + [0], dtype=torch.int32)
    out = torch.full_like(q, float("nan"))

    found = sdpa_paged_decode(q / math.sqrt(HEAD_DIM), k_cache, v_cache, block_tables, context_lens, out=out)

    assert found is out
    for row, ((k, v), n) in enumerate(zip(contexts, lengths)):
        torch.testing.assert_close(out[row], dense(q[row:row + 1], k, v, n - 1)[0])
    assert torch.equal(out[3], torch.zeros(HEADS, HEAD_DIM))
    assert decode_attention_for(torch.device("cpu")) is sdpa_paged_decode


def test_a_prefill_chunk_attends_its_cached_prefix_and_itself_causally():
    torch.manual_seed(1)
    table, cached, n = [8, 1, 6, 4], 5, 9
    k, v = torch.randn(2, cached + n, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = pool_with([(k, v)], [table])
    q = torch.randn(n, HEADS, HEAD_DIM)
    positions = torch.arange(cached, cached + n)
    mask = torch.arange(len(table) * BLOCK)[None, :] <= positions[:, None]

    out = prefill_attention(q, k_cache, v_cache, torch.tensor(table), mask)

    torch.testing.assert_close(out, dense(q, k, v, cached))


def test_a_chunk_without_a_cached_prefix_takes_sdpa_causal_attention_with_the_same_result():
    torch.manual_seed(2)
    table, n = [3, 10, 7], 10
    k, v = torch.randn(2, n, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = pool_with([(k, v)], [table])
    q = torch.randn(n, HEADS, HEAD_DIM)
    mask = torch.arange(len(table) * BLOCK)[None, :] <= torch.arange(n)[:, None]

    plain = prefill_attention(q, k_cache, v_cache, torch.tensor(table), None)

    torch.testing.assert_close(plain, dense(q, k, v, 0))
    torch.testing.assert_close(plain, prefill_attention(q, k_cache, v_cache, torch.tensor(table), mask))

"""Decode attention over the paged KV pool: a Triton kernel, one new query token per sequence.

One program per (sequence, kv head, split): it loads the kv head's whole query group at once (grouped-query
attention reads each K/V tile once for every query head that shares it, so a step moves each live KV byte
exactly once) and walks its share of the sequence's pages with an online softmax in fp32. A tile is
`BLOCK_N` tokens: several 16-token pages per iteration, each page found through the block table, so every
loop iteration has 2 x 64 x head_dim elements in flight rather than one small page.

Small batches leave most SMs idle with one program per (sequence, kv head) (batch 1 of an 8-kv-head model is
8 programs on 132 SMs), so the sequence is split into up to `_MAX_SPLITS` ranges whose partial results (the
output normalised within the split, and its log-sum-exp) a second kernel merges: the flash-decoding scheme of
vLLM's `vllm/attention/ops/triton_decode_attention.py` (`_fwd_grouped_kernel_stage1` / `_fwd_kernel_stage2`,
after lightllm), where the query group is padded to 16 rows for `tl.dot` as here. The split count depends only
on tensor shapes and the device's SM count, never on the data, so a CUDA graph captured for one batch size
replays for any context lengths; a row whose context_len is 0 (graph padding) produces zeros.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_BLOCK_N = 64          # tokens per tile: four 16-token pages
_MAX_SPLITS = 16
_MIN_HEAD_ROWS = 16    # tl.dot needs M >= 16: a query group of 1..16 heads is padded to 16 rows
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Triton's CPU interpreter computes a bfloat16 tl.dot wrongly (numpy has no bfloat16), so under it the
# kernel upcasts bfloat16 tiles to float32 before the dot; on a GPU the dot runs on bf16 tensor cores.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Fused multiply-add as Triton has always defaulted to; said explicitly because Triton 3.9 warns when the
# default is left implicit (its default changes in 3.10), and a warning is an error under the test suite.
# Two pipeline stages: the next tile's K/V pages stream into shared memory (cp.async) during this tile's math.
_PARTIAL_LAUNCH = {"num_warps": 4, "num_stages": 2, "enable_fp_fusion": True}
_MERGE_LAUNCH = {"num_warps": 4, "enable_fp_fusion": True}


# The block table's width varies step to step on the eager path: specialising on its value (== 1, % 16)
# would compile new variants in the middle of serving.
@triton.jit(do_not_specialize=["stride_bt"])
def _split_partial_kernel(
    Q, K, V, BlockTables, ContextLens, Out, PartOut, PartLse,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_bt, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
    GROUP: tl.constexpr, HEAD_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, HEAD_ROWS)
    dims = tl.arange(0, BLOCK_D)
    toks = tl.arange(0, BLOCK_N)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows

    q = tl.load(Q + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    context_len = tl.load(ContextLens + seq)
    tiles = tl.cdiv(context_len, BLOCK_N)
    tiles_per_split = tl.cdiv(tiles, NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, context_len)

    m_i = tl.full([HEAD_ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([HEAD_ROWS], tl.float32)
    acc = tl.zeros([HEAD_ROWS, BLOCK_D], tl.float32)
    table = BlockTables + seq * stride_bt
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + toks
        tok_ok = pos < end
        # Each token finds its page through the block table; the tile's few distinct entries hit L1.
        block = tl.load(table + pos // BLOCK_SIZE, mask=tok_ok, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k = tl.load(K + block[:, None] * stride_kb + slot[:, None] * stride_kt + kv_head * stride_kh
                    + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + block[:, None] * stride_vb + slot[:, None] * stride_vt + kv_head * stride_vh
                    + dims[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        # base-2 softmax: exp2 is one instruction; the log-sum-exp below stays in base 2 for the merge.
        scores = tl.where(tok_ok[None, :], scores * 1.4426950408889634, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has_tokens = l_i > 0.0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]   # an empty range (padding row, idle split): zeros
    out_mask = row_ok[:, None] & dim_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(Out + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=out_mask)
    else:
        part = seq * stride_pb + heads * stride_ph + split * stride_ps
        tl.store(PartOut + part[:, None] * HEAD_DIM + dims[None, :], out, mask=out_mask)
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        tl.store(PartLse + part, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    PartOut, PartLse, Out, stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_ok = splits < NUM_SPLITS
    part = seq * stride_pb + head * stride_ph + splits * stride_ps
    lse = tl.load(PartLse + part, mask=split_ok, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)   # every split empty (context_len 0): all weights 0
    weight = tl.exp2(lse - top)
    parts = tl.load(PartOut + part[:, None] * HEAD_DIM + dims[None, :],
                    mask=split_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    total = tl.sum(weight, axis=0)
    out = tl.sum(parts * weight[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(Out + seq * stride_ob + head * stride_oh + dims, out.to(Out.dtype.element_ty),
             mask=dims < HEAD_DIM)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8     # the interpreter: a small count so small batches still take the split path
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_splits(batch: int, num_kv_heads: int, max_blocks_per_seq: int, block_size: int,
                  device: torch.device) -> int:
    """How many ranges each sequence's context is split into: enough programs for two waves over the SMs,
    no more splits than tiles a full-length row has, a power of two (each count is a separate compile of
    both kernels). Shapes only, so it is fixed for a captured batch size."""
    programs = batch * num_kv_heads
    wanted = triton.cdiv(2 * _sm_count(device), programs)
    tiles = triton.cdiv(max_blocks_per_seq * block_size, _BLOCK_N)
    splits = max(1, min(wanted, tiles, _MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


def _check(q, k_cache, v_cache, block_tables, context_lens, out) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"want q [B, heads, dim] and caches [blocks, block_size, kv_heads, dim], "
                         f"got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or heads % kv_heads:
        raise ValueError(f"{heads} query heads of dim {head_dim} do not fit kv heads {kv_heads} of dim "
                         f"{k_cache.shape[3]}")
    if q.dtype not in _DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one of {_DTYPES}, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise TypeError("block_tables and context_lens must be int32")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or tuple(context_lens.shape) != (batch,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} / context_lens {tuple(context_lens.shape)} "
                         f"do not match batch {batch}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, context_lens)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                            or out.stride(-1) != 1):
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} on {q.device} with a contiguous last dim")


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           out: torch.Tensor | None = None, *, num_splits: int | None = None) -> torch.Tensor:
    """Attention of each row's one query (already scaled by 1/sqrt(head_dim)) over its first context_len
    cached tokens, found through its block table. Returns [B, heads, head_dim] in q's dtype; rows with
    context_len 0 are zeros. `num_splits` overrides the shape-derived split count (tests)."""
    _check(q, k_cache, v_cache, block_tables, context_lens, out)
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    splits = num_splits or decode_splits(batch, kv_heads, block_tables.shape[1], block_size, q.device)
    if splits > 1:
        part_out = torch.empty((batch, heads, splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, heads, splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out   # unused: the kernel writes the output directly
    _split_partial_kernel[(batch, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), heads * splits, splits, 1,
        **_partial_constants(heads, kv_heads, head_dim, block_size, splits, q.dtype), **_PARTIAL_LAUNCH,
    )
    if splits > 1:
        _merge_splits_kernel[(batch, heads)](
            part_out, part_lse, out, heads * splits, splits, 1, out.stride(0), out.stride(1),
            **_merge_constants(head_dim, splits), **_MERGE_LAUNCH,
        )
    return out


def precompile(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Compile every split count's variants now (at load) for q's head shape and dtype and this cache's
    layout, so no step pays a compile (seconds) later: a one-row call per split count, over nothing."""
    table = torch.zeros((1, 1), dtype=torch.int32, device=q.device)
    empty = torch.zeros(1, dtype=torch.int32, device=q.device)
    splits = 1
    while splits <= _MAX_SPLITS:
        paged_decode_attention(q[:1], k_cache, v_cache, table, empty, num_splits=splits)
        splits *= 2


def _partial_constants(heads: int, kv_heads: int, head_dim: int, block_size: int, splits: int,
                       dtype: torch.dtype) -> dict:
    group = heads // kv_heads
    return {"GROUP": group, "HEAD_ROWS": max(_MIN_HEAD_ROWS, triton.next_power_of_2(group)),
            "HEAD_DIM": head_dim, "BLOCK_D": _block_d(head_dim), "BLOCK_SIZE": block_size, "BLOCK_N": _BLOCK_N,
            "NUM_SPLITS": splits, "DOT_FP32": _INTERPRETED and dtype == torch.bfloat16,
            "IEEE": dtype == torch.float32}


def _merge_constants(head_dim: int, splits: int) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_D": _block_d(head_dim), "NUM_SPLITS": splits,
            "BLOCK_S": triton.next_power_of_2(splits)}


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))   # tl.dot needs K >= 16

"""Attention over the paged KV pool: decode rows (one query per sequence) and prefill chunks.

Decode rows take the paged decode attention contract (`DecodeAttention`, the signature of
`triton_attention.paged_decode_attention`): on CUDA the Triton kernel, elsewhere `sdpa_paged_decode`,
SDPA over each row's gathered blocks with a length mask. Both keep fixed shapes and never look at tensor
values from the host, so a decode step captured in a CUDA graph replays for any batch.

A prefill chunk of one sequence attends its cached context and itself: SDPA over the sequence's gathered
blocks, causal with the query positions offset by the tokens already cached (the mask StepInputs builds),
or SDPA's own causal kernel when nothing is cached before the chunk. Grouped-query attention without
copying K/V per query head: the G query heads of one KV head are laid out as G * n query rows of that head.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# (q [B, heads, D] already scaled by 1/sqrt(D), k_cache, v_cache [blocks + 1, block_size, kv_heads, D],
#  block_tables int32 [B, max_blocks], context_lens int32 [B], out=None) -> [B, heads, D]; rows with 0 give zeros
DecodeAttention = Callable[..., torch.Tensor]


def decode_attention_for(device: torch.device) -> DecodeAttention:
    """The paged decode attention that runs on `device`: the Triton kernel on CUDA, SDPA elsewhere."""
    if device.type == "cuda":
        from inferd.engine.torch.triton_attention import paged_decode_attention   # CPU never imports triton
        return paged_decode_attention
    return sdpa_paged_decode


def sdpa_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      context_lens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The paged decode attention contract with SDPA over gathered blocks (every row reads max_blocks blocks).

    A padding row (context_len 0) attends slot 0 of its table's first block, which is finite, and its
    output is then zeroed: a fully masked softmax would be NaN.
    """
    rows, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    length = block_tables.shape[1] * block_size
    blocks = block_tables.long()
    k = k_cache[blocks].reshape(rows, length, kv_heads, head_dim).transpose(1, 2)     # [B, kv, L, D]
    v = v_cache[blocks].reshape(rows, length, kv_heads, head_dim).transpose(1, 2)
    lens = context_lens.long()
    visible = torch.arange(length, device=q.device)[None, :] < lens.clamp(min=1)[:, None]   # [B, L]
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, head_dim)                        # [B, kv, G, D]
    result = F.scaled_dot_product_attention(grouped, k, v, attn_mask=visible[:, None, None, :], scale=1.0)
    result = result.reshape(rows, heads, head_dim) * (lens > 0).to(q.dtype)[:, None, None]
    if out is None:
        return result
    return out.copy_(result)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
                      causal_mask: torch.Tensor | None) -> torch.Tensor:
    """Attention of one sequence's chunk `q` ([n, heads, D], unscaled) over its blocks `blocks` (int64
    [num_blocks], covering its context, this chunk's K/V already written). `causal_mask`: bool [n, L]
    (L = num_blocks * block_size), True where query i sees key j; None when the chunk is the whole context
    (no cached prefix, context_len == n), which is SDPA's plain causal attention. Returns [n, heads, D]."""
    n, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    k = k_cache[blocks].reshape(-1, kv_heads, head_dim).transpose(0, 1)               # [kv, L, D]
    v = v_cache[blocks].reshape(-1, kv_heads, head_dim).transpose(0, 1)
    if causal_mask is None:
        result = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None, :, :n], v[None, :, :n],
                                                is_causal=True, enable_gqa=True)      # [1, heads, n, D]
        return result[0].transpose(0, 1)
    grouped = q.reshape(n, kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(1, kv_heads, group * n, head_dim)
    mask = causal_mask[None].expand(group, -1, -1).reshape(1, 1, group * n, -1)       # rows as in `grouped`
    # 4-D with a boolean mask: CUDA's memory-efficient kernel takes it (3-D inputs fall back to the math path)
    result = F.scaled_dot_product_attention(grouped, k[None], v[None], attn_mask=mask)   # [1, kv, G * n, D]
    return result.reshape(kv_heads, group, n, head_dim).permute(2, 0, 1, 3).reshape(n, heads, head_dim)

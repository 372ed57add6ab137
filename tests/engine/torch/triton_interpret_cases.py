"""Runs the paged decode kernel under Triton's CPU interpreter and prints each case's error as JSON.

Run as a script in a subprocess (test_triton_attention.py does): TRITON_INTERPRET=1 must be set before
triton is imported, which a pytest process that may already have imported it cannot guarantee.
Each case compares the kernel to plain torch (softmax over the row's gathered blocks, in float64).
"""
from __future__ import annotations

import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1 before running this script")

import torch

from inferd.engine.torch.triton_attention import decode_splits, paged_decode_attention


def reference(q, k_cache, v_cache, block_tables, context_lens):
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(batch, heads, dim, dtype=torch.float64)
    for row in range(batch):
        length = int(context_lens[row])
        if length == 0:
            continue
        blocks = block_tables[row, : -(-length // block_size)].long()
        k = k_cache[blocks].reshape(-1, kv_heads, dim)[:length].double()
        v = v_cache[blocks].reshape(-1, kv_heads, dim)[:length].double()
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,thd->ht", q[row].double(), k)
        out[row] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v)
    return out


def make_case(*, dtype, heads, kv_heads, dim, block_size, lens, seed):
    """Caches whose pages are shuffled, whose slots past each context are NaN (a read past the context
    would show), and a q that is a strided view (as a slice of a fused qkv projection is)."""
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in lens) + 1
    num_blocks = len(lens) * max_blocks + 1
    shape = (num_blocks + 1, block_size, kv_heads, dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen)[: len(lens) * max_blocks].view(len(lens), max_blocks)
    block_tables = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    for row, length in enumerate(lens):
        used = -(-length // block_size)
        block_tables[row, :used] = order[row, :used].int()
        if length % block_size:
            k_cache[order[row, used - 1], length % block_size:] = float("nan")
            v_cache[order[row, used - 1], length % block_size:] = float("nan")
    fused = torch.randn(len(lens), heads + 2 * kv_heads, dim, generator=gen).to(dtype) / dim ** 0.5
    q = fused[:, :heads]
    return q, k_cache, v_cache, block_tables, torch.tensor(lens, dtype=torch.int32)


def max_error(case, num_splits=None):
    got = paged_decode_attention(*case, num_splits=num_splits)
    if got.dtype != case[0].dtype or got.shape != case[0].shape:
        return float("inf")
    return float((got.double() - reference(*case)).abs().max())


def shape(dtype, heads, kv_heads, dim, block_size, lens):
    return {"dtype": dtype, "heads": heads, "kv_heads": kv_heads, "dim": dim, "block_size": block_size,
            "lens": lens}


CASES = {
    # name: (case shape, split counts to run; None: the shape-derived count)
    "float32_gqa4_block16": (shape(torch.float32, 8, 2, 32, 16, [1, 16, 0, 70, 64, 33]), (1, 3, None)),
    "float16_gqa4_block16": (shape(torch.float16, 8, 2, 32, 16, [1, 16, 0, 70, 64, 33]), (1, 3)),
    "bfloat16_gqa4_block32": (shape(torch.bfloat16, 8, 2, 32, 32, [32, 1, 0, 97]), (1, 2)),
    "float32_mha_block32": (shape(torch.float32, 2, 2, 16, 32, [0, 32, 65, 5]), (1, 2)),
    "float16_mha_block16_dim24": (shape(torch.float16, 2, 2, 24, 16, [17, 0, 48]), (1, 4)),
    "float32_gqa2_block16_dim8": (shape(torch.float32, 4, 2, 8, 16, [3, 40]), (1, 2)),
}


def main() -> None:
    errors = {}
    for name, (kwargs, split_counts) in CASES.items():
        case = make_case(seed=len(errors), **kwargs)
        for splits in split_counts:
            errors[f"{name}_splits{splits or 'auto'}"] = max_error(case, splits)
    # all rows padding: every split empty, the merge must still write zeros
    padding = make_case(dtype=torch.float32, heads=4, kv_heads=1, dim=16, block_size=16, lens=[0, 0], seed=9)
    errors["all_padding_splits2"] = max_error(padding, 2)
    # out= is written in place and returned
    case = make_case(dtype=torch.float16, heads=4, kv_heads=1, dim=16, block_size=16, lens=[5, 20], seed=7)
    out = torch.full_like(case[0], float("nan"))
    returned = paged_decode_attention(*case, out=out)
    errors["out_param"] = (float((out.double() - reference(*case)).abs().max())
                           if returned.data_ptr() == out.data_ptr() else float("inf"))
    errors["auto_splits_small_batch"] = decode_splits(1, 2, 8, 16, torch.device("cpu"))
    print(json.dumps(errors))


if __name__ == "__main__":
    main()

"""Paged KV storage: per-layer K and V arrays addressed by flat slot = block_id * block_size + offset.

Which blocks a sequence owns is the block manager's business (integer ids only). This module
stores K/V, writes it by slot mapping and gathers it back by block table.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class KVCacheError(ValueError):
    """A block table or slot mapping does not fit the cache."""


class PagedKVCache:
    """K and V for every layer, each `[num_blocks * block_size, num_kv_heads, head_dim]` float32.

    Storage starts zeroed (calloc: pages are touched only when written), so gathering a slot that was
    never written yields finite numbers that the attention mask then discards.
    """

    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int) -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks),
                            ("block_size", block_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if value < 1:
                raise KVCacheError(f"{name} must be >= 1, got {value}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.num_slots = num_blocks * block_size
        shape = (self.num_slots, num_kv_heads, head_dim)
        self.k = [np.zeros(shape, np.float32) for _ in range(num_layers)]
        self.v = [np.zeros(shape, np.float32) for _ in range(num_layers)]

    def write(self, layer: int, slot_mapping: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store `k`, `v` ([T, num_kv_heads, head_dim]) at flat slots `slot_mapping` ([T])."""
        self.k[layer][slot_mapping] = k
        self.v[layer][slot_mapping] = v

    def copy_block(self, src: int, dst: int) -> None:
        """Block `dst` becomes a copy of block `src` in every layer (a forked sequence's partial block)."""
        bs = self.block_size
        for layer in range(self.num_layers):
            self.k[layer][dst * bs:(dst + 1) * bs] = self.k[layer][src * bs:(src + 1) * bs]
            self.v[layer][dst * bs:(dst + 1) * bs] = self.v[layer][src * bs:(src + 1) * bs]

    def gather(self, layer: int, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """K and V at `slots` (any int array shape S): two arrays of shape S + (num_kv_heads, head_dim)."""
        return self.k[layer][slots], self.v[layer][slots]

    def slots_for_positions(self, block_table: Sequence[int], positions: np.ndarray) -> np.ndarray:
        """Flat slots of token positions of one sequence whose blocks are `block_table`, in order."""
        table = np.asarray(block_table, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= table.size * self.block_size):
            raise KVCacheError(
                f"positions up to {int(positions.max())} need more than the {table.size} blocks in block_table")
        self._check_block_ids(table)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def block_array(self, block_tables: Sequence[Sequence[int]], context_lens: Sequence[int]) -> np.ndarray:
        """The blocks holding positions 0..len-1 of every sequence, as `[S, max_blocks]` int64 padded with 0."""
        if len(context_lens) != len(block_tables):
            raise KVCacheError(f"{len(context_lens)} context_lens for {len(block_tables)} block_tables")
        needed = [-(-int(length) // self.block_size) for length in context_lens]
        tables = np.zeros((len(block_tables), max(needed, default=0)), dtype=np.int64)
        for i, (table, length, count) in enumerate(zip(block_tables, context_lens, needed)):
            if length < 1 or len(table) < count:
                raise KVCacheError(f"sequence {i}: context_len {length} needs {count} blocks, "
                                   f"block_table has {len(table)}")
            tables[i, :count] = table[:count]
        self._check_block_ids(tables)
        return tables

    def gather_blocks(self, layer: int, blocks: np.ndarray, k_out: np.ndarray | None = None,
                      v_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """K and V of whole blocks (ids `blocks`, any shape B): shape B + (block_size, num_kv_heads, head_dim).

        Copies block-sized runs (faster than slot by slot); `k_out`/`v_out` reuse buffers across layers.
        Ids are not range-checked here (out-of-range ones are clipped): `block_array` checks them.
        """
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        k = np.take(self.k[layer].reshape(shape), blocks, axis=0, out=k_out, mode="clip")
        v = np.take(self.v[layer].reshape(shape), blocks, axis=0, out=v_out, mode="clip")
        return k, v

    def _check_block_ids(self, table: np.ndarray) -> None:
        if table.size and (table.min() < 0 or table.max() >= self.num_blocks):
            raise KVCacheError(f"block ids must be in [0, {self.num_blocks}), got "
                               f"{int(table.min())}..{int(table.max())}")


# Decode sequences share one padded gather; a sequence much shorter than the longest would waste
# its padding. Splitting the batch costs ~10 more NumPy calls per layer, about what gathering and
# attending this many padded tokens costs, so a group is split when that much padding is saved.
_SPLIT_SAVES_TOKENS = 512


class DecodeGroup:
    """Decode sequences attended together: their blocks gathered into one padded batch."""

    def __init__(self, kv: PagedKVCache, rows: np.ndarray, tables: np.ndarray, context_lens: np.ndarray) -> None:
        bs = kv.block_size
        self.rows = rows                                         # [S] rows of the step's tokens
        self.blocks = np.ascontiguousarray(tables[:, :-(-int(context_lens.max()) // bs)])
        valid = np.arange(self.blocks.shape[1] * bs)[None, :] < context_lens[:, None]
        self.bias = np.where(valid, np.float32(0.0), np.float32(-np.inf))[:, None, None, :]
        buf_shape = (*self.blocks.shape, bs, kv.num_kv_heads, kv.head_dim)
        self.k_buf = np.empty(buf_shape, np.float32)             # reused by every layer of the step
        self.v_buf = np.empty(buf_shape, np.float32)


class AttentionPlan:
    """Where each sequence of one packed step reads its context: built once per step, used by every layer.

    Sequences with one new token (decode) are attended in a few padded groups of similar context
    length, with a length mask. Sequences with several (prefill chunks) go one by one with a causal
    mask whose query positions start at `context_len - query_len`, so cached prefixes and earlier
    chunks are attended too.
    """

    def __init__(self, kv: PagedKVCache, query_lens: Sequence[int], context_lens: Sequence[int],
                 block_tables: Sequence[Sequence[int]]) -> None:
        if not (len(query_lens) == len(context_lens) == len(block_tables)):
            raise KVCacheError(f"query_lens ({len(query_lens)}), context_lens ({len(context_lens)}) and "
                               f"block_tables ({len(block_tables)}) must have one entry per sequence")
        q_lens = np.asarray(query_lens, dtype=np.int64)
        c_lens = np.asarray(context_lens, dtype=np.int64)
        if q_lens.size and (q_lens.min() < 1 or (q_lens > c_lens).any()):
            raise KVCacheError("every sequence needs 1 <= query_len <= context_len")
        bs = kv.block_size
        starts = np.concatenate(([0], np.cumsum(q_lens)))
        self.num_tokens = int(starts[-1])
        self.last_rows = starts[1:] - 1
        tables = kv.block_array(block_tables, context_lens)
        # flat slot of every new token, to check the caller's slot_mapping against
        seq_of_token = np.repeat(np.arange(q_lens.size), q_lens)
        token_pos = np.arange(self.num_tokens) - starts[seq_of_token] + (c_lens - q_lens)[seq_of_token]
        self.token_slots = tables[seq_of_token, token_pos // bs] * bs + token_pos % bs

        self.decode_groups: list[DecodeGroup] = []
        decode = np.flatnonzero(q_lens == 1)
        decode = decode[np.argsort(-c_lens[decode], kind="stable")]     # longest first
        padded = -(-c_lens[decode] // bs) * bs
        first = 0
        for j in range(1, decode.size + 1):
            if j == decode.size or (padded[first] - padded[j]) * (decode.size - j) >= _SPLIT_SAVES_TOKENS:
                members = decode[first:j]
                self.decode_groups.append(DecodeGroup(kv, starts[members], tables[members], c_lens[members]))
                first = j

        self.prefill: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        for i in np.flatnonzero(q_lens > 1):
            q, c, start = int(q_lens[i]), int(c_lens[i]), int(starts[i])
            blocks = tables[i, :-(-c // bs)]
            query_pos = np.arange(c - q, c)[:, None]
            causal = np.where(np.arange(blocks.size * bs)[None, :] <= query_pos,
                              np.float32(0.0), np.float32(-np.inf))
            self.prefill.append((start, start + q, blocks, causal))


def _softmax_inplace(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _matvec_by_matmul(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """np.matvec (NumPy >= 2.2) for real arrays: `a [..., M, N] @ x [..., N] -> [..., M]`."""
    return np.matmul(a, x[..., None])[..., 0]


def _vecmat_by_matmul(x: np.ndarray, a: np.ndarray) -> np.ndarray:
    """np.vecmat (NumPy >= 2.2) for real arrays: `x [..., N] @ a [..., N, M] -> [..., M]`."""
    return np.matmul(x[..., None, :], a)[..., 0, :]


# np.matvec/np.vecmat are the fast path for decode attention; older NumPy (TensorRT-LLM pins numpy<2)
# gets the same products as batched matmuls with a unit dimension.
_matvec = getattr(np, "matvec", _matvec_by_matmul)
_vecmat = getattr(np, "vecmat", _vecmat_by_matmul)


def paged_attention(kv: PagedKVCache, layer: int, q: np.ndarray, plan: AttentionPlan) -> np.ndarray:
    """Attention of the step's queries `q` ([T, num_heads, head_dim], already scaled by 1/sqrt(head_dim))
    over each sequence's context in `kv` (this step's K/V already written). Returns [T, num_heads, head_dim].

    Grouped-query attention: query head h reads KV head h // (num_heads // num_kv_heads).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv = kv.num_kv_heads
    group = num_heads // num_kv
    out = np.empty_like(q)
    for dg in plan.decode_groups:
        n = dg.rows.size
        k, v = kv.gather_blocks(layer, dg.blocks, dg.k_buf, dg.v_buf)
        k = k.reshape(n, -1, num_kv, head_dim).transpose(0, 2, 1, 3)[:, :, None]    # [S, kv, 1, L, D]
        v = v.reshape(n, -1, num_kv, head_dim).transpose(0, 2, 1, 3)[:, :, None]
        qd = q[dg.rows].reshape(n, num_kv, group, head_dim)
        # one query row per (sequence, head): matrix-vector products beat tiny matmuls here
        scores = _matvec(k, qd)                                                    # [S, kv, G, L]
        scores += dg.bias
        probs = _softmax_inplace(scores)
        out[dg.rows] = _vecmat(probs, v).reshape(n, num_heads, head_dim)
    for start, end, blocks, causal in plan.prefill:
        n = end - start
        k, v = kv.gather_blocks(layer, blocks)
        k = k.reshape(-1, num_kv, head_dim)                                        # [C, kv, D]
        v = v.reshape(-1, num_kv, head_dim)
        qp = q[start:end].reshape(n, num_kv, group, head_dim).transpose(1, 2, 0, 3)   # [kv, G, n, D]
        scores = np.matmul(qp, k.transpose(1, 2, 0)[:, None])                        # [kv, G, n, C]
        scores += causal
        probs = _softmax_inplace(scores)
        ctx = np.matmul(probs, v.transpose(1, 0, 2)[:, None])                        # [kv, G, n, D]
        out[start:end] = ctx.transpose(2, 0, 1, 3).reshape(n, num_heads, head_dim)
    return out

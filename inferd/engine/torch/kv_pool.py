"""The paged KV pool on the device: per layer K and V as `[num_blocks + 1, block_size, num_kv_heads, head_dim]`.

Slot `s` is block `s // block_size`, offset `s % block_size`, as in the reference's PagedKVCache; which
blocks a sequence owns is the block manager's business. The pool has one block more than it hands out:
block `num_blocks` is scratch, where the padded rows of a captured decode step write their K/V, so a
graph replayed for fewer live sequences never touches a real block.

All layers live in one allocation (one `torch.zeros`, so sizing it against free memory is one number),
and `k[layer]` / `v[layer]` are views of it. Zero-initialised: a gathered slot that was never written is
finite, and the attention mask discards it.
"""
from __future__ import annotations

import torch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class KVPoolError(ValueError):
    """A pool shape, slot mapping or block id that does not fit the pool."""


class KVPool:
    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KVPoolError(f"{name} must be a positive integer, got {value!r}")
        if dtype not in _DTYPES:
            raise KVPoolError(f"dtype must be one of {', '.join(str(d) for d in _DTYPES)}, got {dtype}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.scratch_slot = num_blocks * block_size
        # [K/V, layer, block, offset, kv head, dim]: block `num_blocks` is the scratch block
        self._storage = torch.zeros((2, num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim),
                                    dtype=dtype, device=device)
        self.device = self._storage.device         # with its index: "cuda" becomes "cuda:0"
        self.k = list(self._storage[0].unbind(0))
        self.v = list(self._storage[1].unbind(0))

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """K and V of one block in every layer."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds on its device, the scratch block included."""
        return self._storage.numel() * self._storage.element_size()

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store `k`, `v` ([T, num_kv_heads, head_dim]) at flat slots `slot_mapping` (int64 [T], on the device).

        No host sync and no check of the slots' values (a captured graph cannot look at them): callers
        check slots on the host before they reach the device.
        """
        shape = (-1, self.num_kv_heads, self.head_dim)
        self.k[layer].view(shape).index_copy_(0, slot_mapping, k.to(self.dtype))
        self.v[layer].view(shape).index_copy_(0, slot_mapping, v.to(self.dtype))

    def copy_block(self, src: int, dst: int) -> None:
        """Block `dst` becomes a copy of block `src` in every layer (a forked sequence's partial block)."""
        for block in (src, dst):
            if not 0 <= block < self.num_blocks:
                raise KVPoolError(f"block ids must be in [0, {self.num_blocks}), got {block}")
        self._storage[:, :, dst].copy_(self._storage[:, :, src])


def blocks_for_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """How many blocks a KVPool may hand out within `budget_bytes`, its scratch block paid for (>= 0)."""
    if bytes_per_block < 1:
        raise KVPoolError(f"bytes_per_block must be >= 1, got {bytes_per_block}")
    return max(0, budget_bytes // bytes_per_block - 1)

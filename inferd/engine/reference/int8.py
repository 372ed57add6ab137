"""Int8 weight-only matrices for the reference engine: a quarter of float32's memory, float32 arithmetic.

A weight [out, in] is stored as int8 with one float32 scale per output channel (row): w ≈ q * scale[:, None],
the symmetric per-channel scheme of weight-only INT8 in TensorRT-LLM and vLLM. Activations, norms, attention
and the KV cache stay float32. A product dequantizes a block of rows at a time, small enough to stay in the
CPU's cache while BLAS reads it, so memory traffic is the int8 bytes plus one block; the scale multiplies the
output columns, not the weights. The embedding is such a matrix too (a row per token); with tied embeddings
one matrix serves as the LM head.

Built by `build_engines.py --quantize int8` (inferd.engine.reference.quantize).
"""
from __future__ import annotations

import numpy as np

# Rows dequantized per block: about 256 KiB of float32 at the widest input, so a block stays in L2.
_BLOCK_ELEMENTS = 1 << 16


class Int8Matrix:
    """int8 `q` [out, in] and float32 `scale` [out]: the matrix q * scale[:, None]."""

    __slots__ = ("q", "scale", "_block")

    def __init__(self, q: np.ndarray, scale: np.ndarray) -> None:
        if q.dtype != np.int8 or q.ndim != 2 or scale.shape != (q.shape[0],):
            raise ValueError(f"an int8 matrix needs int8 [out, in] and a scale per row, got {q.dtype} "
                             f"{q.shape} and scale {scale.shape}")
        self.q = np.ascontiguousarray(q)
        self.scale = np.ascontiguousarray(scale, dtype=np.float32)
        self._block = max(1, _BLOCK_ELEMENTS // q.shape[1])

    @classmethod
    def quantize(cls, w: np.ndarray) -> "Int8Matrix":
        """Per-row symmetric int8 of float `w` [out, in] (round to nearest; an all-zero row gets scale 1)."""
        w = np.asarray(w, dtype=np.float32)
        peak = np.abs(w).max(axis=1)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
        return cls(q, scale)

    @classmethod
    def stack(cls, parts: list["Int8Matrix"]) -> "Int8Matrix":
        """The matrices' rows one after another (q, k, v fused into one projection)."""
        return cls(np.concatenate([p.q for p in parts]), np.concatenate([p.scale for p in parts]))

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def dequantize(self) -> np.ndarray:
        return self.q.astype(np.float32) * self.scale[:, None]

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Float32 rows `ids` (an embedding lookup)."""
        return self.q[ids].astype(np.float32) * self.scale[ids, None]

    def linear(self, x: np.ndarray) -> np.ndarray:
        """x @ matrix.T for float32 x [T, in]: [T, out]."""
        out = np.empty((x.shape[0], self.q.shape[0]), dtype=np.float32)
        step = self._block
        for start in range(0, self.q.shape[0], step):
            block = self.q[start:start + step].astype(np.float32)
            np.matmul(x, block.T, out=out[:, start:start + step])
        out *= self.scale
        return out

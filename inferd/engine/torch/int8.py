"""Int8 weight-only matrices for the torch engine: int8 on the device, a scale per output channel.

The artifact's int8 weights and `<name>_scale` tensors (inferd.engine.reference.quantize) stay int8 in device
memory, half of bf16's bytes; each product converts them to the activations' dtype and scales the output
columns (w ≈ q * scale[:, None], so x @ w.T = (x @ q.T) * scale). The conversion makes a full-size temporary
per product: memory read per token is not reduced yet (a fused int8 GEMM kernel would), only what the model
holds, which is what lets a larger model or more KV fit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Int8Weight:
    """int8 `q` [out, in] and `scale` [out] (the model dtype) on the device."""

    __slots__ = ("q", "scale")

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        self.q, self.scale = q, scale

    @classmethod
    def stack(cls, parts: list["Int8Weight"]) -> "Int8Weight":
        return cls(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q, self.scale

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = F.linear(x, self.q.to(x.dtype)) * self.scale
        return y if bias is None else y + bias

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows `ids` (an embedding lookup)."""
        return F.embedding(ids, self.q).to(self.scale.dtype) * self.scale[ids].unsqueeze(-1)


def linear(x: torch.Tensor, w: torch.Tensor | Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    return w.linear(x, bias) if isinstance(w, Int8Weight) else F.linear(x, w, bias)


def embedding(ids: torch.Tensor, w: torch.Tensor | Int8Weight) -> torch.Tensor:
    return w.rows(ids) if isinstance(w, Int8Weight) else F.embedding(ids, w)

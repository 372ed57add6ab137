"""Where the torch decoder's weights come from: a checkpoint (through the host, onto the device in the model
dtype; int8 weight-only tensors stay int8) or random ones made on the device (load_format "dummy").
"""
from __future__ import annotations

import torch

from inferd.engine.reference.weights import Checkpoint
from inferd.engine.torch.int8 import Int8Weight

DUMMY_STD = 0.02          # random weights' scale (the usual initializer_range): activations stay finite in bf16


class CheckpointWeights:
    """Tensors from a safetensors checkpoint, one at a time through the host, onto the device in the model dtype."""

    def __init__(self, checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> None:
        self.checkpoint, self.device, self.dtype = checkpoint, device, dtype

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | Int8Weight:
        if name.endswith(".weight") and len(shape) == 2 and self.checkpoint.quantized(name):
            q = self.checkpoint.get_int8(name, shape)           # int8 weight-only (inferd.engine.torch.int8)
            return Int8Weight(torch.from_numpy(q.q).to(self.device),
                              torch.from_numpy(q.scale).to(device=self.device, dtype=self.dtype))
        return torch.from_numpy(self.checkpoint.get(name, shape)).to(device=self.device, dtype=self.dtype)

    def fused(self, names: list[str], shapes: list[tuple[int, ...]]) -> torch.Tensor | Int8Weight:
        parts = [self.get(n, s) for n, s in zip(names, shapes)]
        return Int8Weight.stack(parts) if isinstance(parts[0], Int8Weight) else torch.cat(parts)


class RandomWeights:
    """Random weights made on the device (no host copy): normal(0, DUMMY_STD), norm weights 1, biases 0."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if "norm" in name:
            return torch.ones(shape, device=self.device, dtype=self.dtype)
        if name.endswith(".bias"):
            return torch.zeros(shape, device=self.device, dtype=self.dtype)
        return torch.empty(shape, device=self.device, dtype=self.dtype).normal_(0.0, DUMMY_STD,
                                                                               generator=self.generator)

    def fused(self, names: list[str], shapes: list[tuple[int, ...]]) -> torch.Tensor:
        rows = sum(s[0] for s in shapes)
        return self.get(names[0], (rows, *shapes[0][1:]))

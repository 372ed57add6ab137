"""LoRA deltas in torch, from the reference engine's loaded adapters (`LoraWeights`, NumPy).

An adapter is turned into device tensors once per (device, dtype) and kept as long as its LoraWeights
lives (a weak-keyed cache: an unloaded adapter's tensors go with it). Each fused site of a layer (qkv, o,
gate_up, down) becomes two matrices: A, the targeted projections' A^T side by side [in, sum of ranks], and
B, their scaled B^T placed at their output columns of the fused projection [sum of ranks, out] (zeros where
a projection is not targeted), so a site's delta is one `x @ A @ B`, the reference's sum of parts.

In a step the base projection runs once over every row; `lora_groups` gathers each distinct adapter's rows
(a slice when they are one run, else an index tensor on the device) and `TorchLora.add` adds its delta there.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import torch

from inferd.engine.reference.config import LlamaConfig
from inferd.engine.reference.lora import LoraWeights
from inferd.engine.reference.lora import lora_groups as reference_lora_groups
from inferd.engine.torch.upload import to_device

_cache: weakref.WeakKeyDictionary[LoraWeights, dict[tuple[torch.device, torch.dtype], TorchLora]] = \
    weakref.WeakKeyDictionary()


def site_widths(config: LlamaConfig) -> dict[str, int]:
    """Output columns of each fused projection the model runs."""
    c = config
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    return {"qkv": qkv, "o": c.hidden_size, "gate_up": 2 * c.intermediate_size, "down": c.hidden_size}


class TorchLora:
    """One adapter's A and B per layer and site, on one device in one dtype. Holds no reference to its
    LoraWeights (the cache is keyed weakly by it)."""

    def __init__(self, name: str, layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]) -> None:
        self.name = name
        self.layers = layers

    def add(self, layer: int, site: str, x: torch.Tensor, y: torch.Tensor, rows: slice | torch.Tensor) -> None:
        """y[rows] += this adapter's delta at `site` of `layer` for inputs x."""
        pair = self.layers[layer].get(site)
        if pair is None:
            return
        a, b = pair
        if isinstance(rows, slice):
            y[rows] += (x[rows] @ a) @ b
        else:
            y.index_add_(0, rows, (x.index_select(0, rows) @ a) @ b)


def torch_lora(weights: LoraWeights, config: LlamaConfig, device: torch.device, dtype: torch.dtype) -> TorchLora:
    """`weights` as device tensors for a model of `config` (converted on first use, then cached)."""
    per_adapter = _cache.setdefault(weights, {})
    key = (torch.device(device), dtype)
    found = per_adapter.get(key)
    if found is None:
        found = per_adapter[key] = _convert(weights, config, key[0], dtype)
    return found


def _convert(weights: LoraWeights, config: LlamaConfig, device: torch.device, dtype: torch.dtype) -> TorchLora:
    widths = site_widths(config)
    layers = []
    for sites in weights.layers:
        converted = {}
        for site, parts in sites.items():
            b = np.zeros((parts.a.shape[1], widths[site]), np.float32)
            for r_cols, out_cols, part in parts.parts:
                b[r_cols, out_cols] = part
            converted[site] = tuple(torch.from_numpy(m).to(device=device, dtype=dtype) for m in (parts.a, b))
        layers.append(converted)
    return TorchLora(weights.name, layers)


def lora_groups(adapters: Sequence[TorchLora | None], query_lens: Sequence[int],
                device: torch.device) -> list[tuple[TorchLora, slice | torch.Tensor]]:
    """Each distinct adapter of a step with the packed rows of its sequences: the reference's grouping (it
    keys adapters by identity only), with scattered rows as an int64 index tensor on `device`."""
    return [(adapter, rows if isinstance(rows, slice) else to_device(rows, torch.device(device)))
            for adapter, rows in reference_lora_groups(adapters, query_lens)]

"""What one engine step hands the torch decoder: the scheduler's packed step as device tensors.

`DecodeInputs` is the shape of a decode-only step (one new token per sequence), fixed-size so a CUDA graph
captured over one set of these buffers replays for any batch that fits: rows past the live ones are padding
(context_len 0, their K/V written to the pool's scratch slot).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DecodeInputs:
    """One decode step over B rows (B: the captured batch size; live rows first, then padding)."""

    token_ids: torch.Tensor        # int64 [B]: each row's newest token
    positions: torch.Tensor        # int64 [B]: its position (context_len - 1); 0 for padding
    slot_mapping: torch.Tensor     # int64 [B]: the flat KV slot its K/V is written to; the scratch slot for padding
    block_tables: torch.Tensor     # int32 [B, max_blocks_per_seq]: its blocks in order, 0-padded
    context_lens: torch.Tensor     # int32 [B]: tokens it attends to, this one included; 0 for padding

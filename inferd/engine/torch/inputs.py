"""What one engine step hands the torch decoder: the scheduler's packed step as device tensors.

`DecodeInputs` is the shape of a decode-only step (one new token per sequence), fixed-size so a CUDA graph
captured over one set of these buffers replays for any batch that fits: rows past the live ones are padding
(context_len 0, their K/V written to the pool's scratch slot).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from inferd.engine.torch.upload import to_device


@dataclass
class DecodeInputs:
    """One decode step over B rows (B: the captured batch size; live rows first, then padding)."""

    token_ids: torch.Tensor        # int64 [B]: each row's newest token
    positions: torch.Tensor        # int64 [B]: its position (context_len - 1); 0 for padding
    slot_mapping: torch.Tensor     # int64 [B]: the flat KV slot its K/V is written to; the scratch slot for padding
    block_tables: torch.Tensor     # int32 [B, max_blocks_per_seq]: its blocks in order, 0-padded
    context_lens: torch.Tensor     # int32 [B]: tokens it attends to, this one included; 0 for padding


class StepInputsError(ValueError):
    """A scheduler step whose packed arrays disagree with each other (lengths, query and context lengths)."""


@dataclass
class PrefillSpan:
    """A sequence with several new tokens this step (a prefill chunk): its rows and its blocks."""

    start: int                     # its first row in the packed step
    end: int                       # one past its last row
    context_len: int               # tokens in its KV after this step
    blocks: torch.Tensor           # int64 [len(block_table)] on the device: its whole block table


@dataclass
class StepInputs:
    """One scheduler step as device tensors, and the host-side facts attention and the checks need.

    Rows are the step's new tokens packed sequence by sequence (the scheduler's order). Decode rows (one new
    token) are attended together through the paged decode attention over `decode_block_tables`; each
    prefill chunk by itself (`prefill`).
    """

    token_ids: torch.Tensor                  # int64 [T]
    positions: torch.Tensor                  # int64 [T]
    slot_mapping: torch.Tensor               # int64 [T]
    last_rows: torch.Tensor                  # int64 [S]: each sequence's last row (whose logits forward returns)
    query_lens: list[int]                    # per sequence: new tokens this step
    context_lens: list[int]                  # per sequence: tokens in KV after this step
    block_counts: list[int]                  # per sequence: blocks in its block table
    decode_rows: torch.Tensor | None         # int64 [Sd]: rows of the decode sequences; None when every row is one
    decode_block_tables: torch.Tensor | None  # int32 [Sd, max blocks], 0-padded; None without decode rows
    decode_context_lens: torch.Tensor | None  # int32 [Sd]
    prefill: list[PrefillSpan]
    loras: list                              # [(TorchLora, rows: slice | int64 tensor)] per distinct adapter
    max_token_id: int
    max_block_id: int
    max_slot: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @classmethod
    def build(cls, out, device: torch.device | str, loras=None) -> StepInputs:
        """From a SchedulerOutput (its num_new_tokens, token_ids, positions, slot_mapping, context_lens,
        block_tables); `loras[i]`: sequence i's TorchLora or None. One host->device copy of the packed
        integers (from pinned memory, non-blocking, on CUDA)."""
        from inferd.engine.torch.lora import lora_groups   # lora imports the reference engine; inputs stays light

        device = torch.device(device)
        q_lens = [int(n) for n in out.num_new_tokens]
        c_lens = [int(n) for n in out.context_lens]
        tables = out.block_tables
        _check_step(out, q_lens, c_lens, tables, loras)
        ends = np.cumsum(q_lens)
        decode = [i for i, n in enumerate(q_lens) if n == 1]
        all_decode = len(decode) == len(q_lens)
        width = max((len(tables[i]) for i in decode), default=0)
        decode_tables = np.zeros((len(decode), width), np.int64)
        for j, i in enumerate(decode):
            decode_tables[j, :len(tables[i])] = tables[i]
        prefill = [i for i, n in enumerate(q_lens) if n > 1]
        parts = [out.token_ids, out.positions, out.slot_mapping, ends - 1,
                 [] if all_decode else ends[decode] - 1, decode_tables.ravel(), [c_lens[i] for i in decode],
                 *(tables[i] for i in prefill)]
        views = _to_device(parts, device)
        spans = [PrefillSpan(start=int(ends[i]) - q_lens[i], end=int(ends[i]), context_len=c_lens[i], blocks=blocks)
                 for i, blocks in zip(prefill, views[7:])]
        return cls(
            token_ids=views[0], positions=views[1], slot_mapping=views[2], last_rows=views[3],
            query_lens=q_lens, context_lens=c_lens, block_counts=[len(t) for t in tables],
            decode_rows=None if all_decode or not decode else views[4],
            decode_block_tables=views[5].view(len(decode), width).to(torch.int32) if decode else None,
            decode_context_lens=views[6].to(torch.int32) if decode else None,
            prefill=spans, loras=lora_groups(loras or [], q_lens, device),
            max_token_id=int(np.max(out.token_ids)), max_block_id=max(max(t, default=0) for t in tables),
            max_slot=int(np.max(out.slot_mapping)))


def _check_step(out, q_lens: list[int], c_lens: list[int], tables: list[list[int]], loras) -> None:
    if not q_lens:
        raise StepInputsError("a step needs at least one sequence")
    if not len(c_lens) == len(tables) == len(q_lens):
        raise StepInputsError(f"num_new_tokens ({len(q_lens)}), context_lens ({len(c_lens)}) and block_tables "
                              f"({len(tables)}) must have one entry per sequence")
    if loras is not None and len(loras) != len(q_lens):
        raise StepInputsError(f"loras has {len(loras)} entries for {len(q_lens)} sequences")
    if any(not 1 <= q <= c for q, c in zip(q_lens, c_lens)):
        raise StepInputsError("every sequence needs 1 <= num_new_tokens <= context_len")
    total = sum(q_lens)
    for name in ("token_ids", "positions", "slot_mapping"):
        arr = np.asarray(getattr(out, name))
        if arr.shape != (total,) or not np.issubdtype(arr.dtype, np.integer):
            raise StepInputsError(f"{name} must be {total} integers (sum of num_new_tokens), got shape {arr.shape}")
    if min(np.min(out.token_ids), np.min(out.slot_mapping), min(min(t, default=0) for t in tables)) < 0:
        raise StepInputsError("token ids, slots and block ids must be >= 0")


def _to_device(parts: list, device: torch.device) -> list[torch.Tensor]:
    """The int64 arrays `parts`, packed into one host buffer and copied to `device` at once; views of it."""
    sizes = [len(p) for p in parts]
    packed = to_device(np.concatenate([np.asarray(p, dtype=np.int64).ravel() for p in parts]), device)
    return list(packed.split(sizes))

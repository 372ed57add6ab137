"""A scheduled step's packed model inputs: token ids, positions and KV slots, flattened with NumPy.

Called by the scheduler (inferd.engine.scheduler) once a step's sequences and token counts are chosen; a
sequence whose chunk runs past its tokens has its draft appended (speculative decoding) and is a draft row.
"""
from __future__ import annotations

import numpy as np

from inferd.engine.step_output import SchedulerOutput

def pack_step(out: SchedulerOutput, bs: int) -> None:
    """Flatten the step's tokens, positions and KV slots (numpy, no per-token Python)."""
    token_ids: list[int] = []
    starts: list[int] = []
    tables = out.block_tables
    slot_parts: list[np.ndarray] = []
    all_single = True
    for row, (seq, n) in enumerate(zip(out.seqs, out.num_new_tokens)):
        start = seq.num_computed_tokens
        end = start + n
        starts.append(start)
        tables.append(seq.block_table)
        out.context_lens.append(end)
        if end >= seq.num_tokens:               # past it: the sequence's draft, verified this step
            out.sample_rows.append(row)
        if n == 1:
            token_ids.append(seq.token_ids[start])
        else:
            all_single = False
            token_ids.extend(seq.token_ids[start:end])
            if end > seq.num_tokens:
                token_ids.extend(seq.draft)
                out.draft_rows.append(row)
    out.token_ids = np.array(token_ids, dtype=np.int64)
    if all_single:
        positions = np.array(starts, dtype=np.int64)
        block_ids = np.array([t[p // bs] for t, p in zip(tables, starts)], dtype=np.int64)
        out.positions = positions
        out.slot_mapping = block_ids * bs + positions % bs
        return
    lens = np.array(out.num_new_tokens, dtype=np.int64)
    offsets = np.cumsum(lens) - lens
    positions = np.arange(lens.sum(), dtype=np.int64) - np.repeat(offsets - np.array(starts), lens)
    for table, start, n in zip(tables, starts, out.num_new_tokens):
        pos = np.arange(start, start + n, dtype=np.int64)
        slot_parts.append(np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs)
    out.positions = positions
    out.slot_mapping = np.concatenate(slot_parts)

"""Step inputs for the torch decoder's tests, from explicit token lists and block tables (no scheduler)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferd.engine.scheduler import SchedulerOutput
from inferd.engine.torch.inputs import StepInputs


@dataclass
class Chunk:
    """One sequence's part of a step: tokens ids[start:] computed now, ids[:start] already in the pool."""

    ids: list[int]
    blocks: list[int]
    start: int = 0


def scheduler_output(chunks: list[Chunk], block_size: int) -> SchedulerOutput:
    """What the scheduler would pack for `chunks`, in order."""
    token_ids, positions, slots = [], [], []
    for c in chunks:
        pos = np.arange(c.start, len(c.ids))
        token_ids.append(np.asarray(c.ids[c.start:], np.int64))
        positions.append(pos)
        slots.append(np.asarray(c.blocks, np.int64)[pos // block_size] * block_size + pos % block_size)
    return SchedulerOutput(num_new_tokens=[len(c.ids) - c.start for c in chunks],
                           token_ids=np.concatenate(token_ids), positions=np.concatenate(positions),
                           slot_mapping=np.concatenate(slots), context_lens=[len(c.ids) for c in chunks],
                           block_tables=[list(c.blocks) for c in chunks])


def step_inputs(chunks: list[Chunk], block_size: int, loras=None) -> StepInputs:
    return StepInputs.build(scheduler_output(chunks, block_size), "cpu", loras)

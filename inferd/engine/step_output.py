"""What one scheduled step is: its sequences, their new tokens, and the packed arrays the model reads
(inferd.engine.scheduler makes it; inferd.engine.step_packing fills the arrays; runners read it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inferd.engine.sequence import Sequence

_NO_IDS = np.zeros(0, np.int64)      # one shared empty array (never written): a step without packed inputs


@dataclass(slots=True)
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)          # scheduled, in batch order
    num_new_tokens: list[int] = field(default_factory=list)     # per scheduled sequence (query_lens)
    preempted: list[Sequence] = field(default_factory=list)     # lost their blocks this step
    token_ids: np.ndarray = field(default_factory=lambda: _NO_IDS)     # packed inputs (pack_inputs only)
    positions: np.ndarray = field(default_factory=lambda: _NO_IDS)
    slot_mapping: np.ndarray = field(default_factory=lambda: _NO_IDS)
    context_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)        # batch rows whose logits yield a token
    first_admitted: int = 0         # seqs[first_admitted:] came from the waiting queue this step
    kv_tokens: int = 0              # K/V entries the step's attention reads (each row's context after it)
    attention_pairs: int = 0        # (query, key) pairs the step's attention computes
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (source, new) K/V to copy first (forks)
    resumed: list[Sequence] = field(default_factory=list)      # parked ones that took a slot again this step
    draft_rows: list[int] = field(default_factory=list)         # batch rows whose last tokens are a draft

    @property
    def empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.size)

"""The torch engine's draft model: a TorchLlama of the same tokenizer over a KV pool of the target's geometry.

The drafting itself (catching up, k passes, guesses and their distributions) is the reference engine's
(inferd.engine.speculative.draft_model.DraftModel); this is the model it runs: each pass one packed eager
step through `TorchLlama.forward`, its logits read back to the host as NumPy (k small transfers a step).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from inferd.engine.sequence import Sequence
from inferd.engine.speculative.draft_model import check_draft_artifact, check_draft_vocabulary, positions_and_slots
from inferd.engine.torch.inputs import StepInputs
from inferd.engine.torch.model import TorchLlama


class TorchDraft:
    def __init__(self, model: TorchLlama, num_blocks: int, block_size: int) -> None:
        self.model = model
        self.pool = model.new_kv_pool(num_blocks, block_size)
        self.block_size = block_size

    @classmethod
    def load(cls, draft_dir: Path, target_dir: Path, vocab_size: int, num_blocks: int, block_size: int, *,
             device: torch.device, dtype: torch.dtype) -> "TorchDraft":
        check_draft_artifact(draft_dir, target_dir)
        model = TorchLlama.from_pretrained(draft_dir, device=device, dtype=dtype)
        check_draft_vocabulary(draft_dir, model.config.vocab_size, vocab_size)
        return cls(model, num_blocks, block_size)

    def memory_bytes(self) -> int:
        return self.model.weight_bytes() + self.pool.nbytes

    def logits(self, seqs: list[Sequence], queries: list[list[int]], starts: list[int]) -> np.ndarray:
        positions, slots = positions_and_slots(seqs, queries, starts, self.block_size)
        step = SimpleNamespace(num_new_tokens=[len(q) for q in queries],
                               context_lens=[s + len(q) for s, q in zip(starts, queries)],
                               block_tables=[seq.block_table for seq in seqs],
                               token_ids=np.asarray([t for q in queries for t in q], dtype=np.int64),
                               positions=positions, slot_mapping=slots)
        with torch.no_grad():
            return self.model.forward(StepInputs.build(step, self.model.device), self.pool).float().cpu().numpy()

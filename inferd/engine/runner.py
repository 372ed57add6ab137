"""The model side of a step engine (inferd.engine.step_engine): what one scheduled step computes.

A step engine owns the scheduler, the block manager, the requests and their streams; its runner owns
the weights, the KV storage and the sampling arithmetic. Each step the engine hands the runner the
scheduler's output and gets back one token per sampled row, with the log-probabilities asked for.
The runner is used on the step thread only. Backends: the NumPy reference (inferd.engine.reference.runner)
and PyTorch on CUDA or the CPU (inferd.engine.torch.runner).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from inferd.engine.reference.config import LlamaConfig
from inferd.engine.scheduler import SchedulerOutput
from inferd.engine.sequence import Sequence
from inferd.types import TokenLogprob


@dataclass
class StepResult:
    """One step's outcome, row by row of `SchedulerOutput.sample_rows`."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]          # a row that asked for logprobs gets its token's (else None)
    # Sequences still in their prompt that asked for prompt log-probabilities: (sequence, position of
    # the chunk's first token, float32 [chunk, vocab] logits at every position of the chunk).
    prompt_logits: list[tuple[Sequence, int, np.ndarray]] = field(default_factory=list)
    # Row by row of sample_rows, the draft tokens the model kept before `tokens` (None: no row had a draft).
    kept: list[list[int]] | None = None


class ModelRunner(Protocol):
    config: LlamaConfig

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Copy forked blocks (out.block_copies), run the forward pass over the packed step (K/V written to
        the cache), mask each guided row by its grammar (grammar.failed set on a dead end), and sample one
        token per out.sample_rows row with each sequence's own rng; a row with a draft (out.draft_rows)
        has it verified first (inferd.engine.speculative.verify). Does not advance grammars."""
        ...

    def memory_bytes(self) -> int:
        """Bytes held: the weights and the KV storage."""
        ...

    def fatal(self, exc: Exception) -> bool:
        """Whether a step's exception leaves the runner unusable (a device fault): the engine then stops
        and fails everything, instead of failing that step's requests and carrying on."""
        ...


def prompt_logit_rows(out: SchedulerOutput) -> list[int]:
    """Batch rows whose sequences want prompt log-probabilities and are still in their prompt: only they
    pay the LM head at every position of their chunk."""
    return [i for i, seq in enumerate(out.seqs) if seq.sampling.prompt_logprobs is not None
            and seq.num_computed_tokens < seq.num_prompt_tokens - 1]

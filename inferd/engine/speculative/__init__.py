"""Speculative decoding for the step engines (reference, torch): draft tokens cheaply, verify them in one
target step, keep those the target agrees with.

- `Speculation`: a model's settings (its [models.<name>.speculative] table, inferd.config.speculative).
- `Speculator` (drafting): before each step, drafts for the running sequences that may speculate, and
  the counters the metrics read.
- `NgramProposer` (ngram): prompt lookup; `DraftModelProposer` (draft_model): a smaller model of the
  same tokenizer.
- verify: the rejection rule, which keeps the target's distribution (greedy output unchanged).

The scheduler counts a sequence's draft in its step's token budget (inferd.engine.scheduler).
"""
from __future__ import annotations

from inferd.engine.speculative.drafting import Speculation, SpeculationCounters, Speculator, make_speculator
from inferd.engine.speculative.ngram import NgramProposer
from inferd.engine.speculative.verify import verify_row

__all__ = ["NgramProposer", "Speculation", "SpeculationCounters", "Speculator", "make_speculator", "verify_row"]

"""Speculative decoding for the step engines: draft tokens cheaply, verify them in one step, keep the agreed.

The reference and torch engines draft by prompt lookup, the reference one also with a draft model; the
target verifies k drafts in one step and keeps those it agrees with.

- `Speculation`: a model's settings (its [models.<name>.speculative] table, inferd.config.speculative).
- `Speculator` (drafting): before each step, drafts for the running sequences that may speculate, and
  the counters the metrics read.
- `NgramProposer` (ngram): prompt lookup; `DraftModel` (draft_model): a smaller model of the same
  tokenizer, run by the reference runner inside the step.
- verify: the rejection rule, which keeps the target's distribution (greedy output unchanged).

The scheduler counts a sequence's draft in its step's token budget (inferd.engine.scheduler).
"""
from __future__ import annotations

from inferd.engine.speculative.drafting import Speculation, SpeculationCounters, Speculator, make_speculator
from inferd.engine.speculative.ngram import NgramProposer
from inferd.engine.speculative.verify import verify_row

__all__ = ["NgramProposer", "Speculation", "SpeculationCounters", "Speculator", "make_speculator", "verify_row"]

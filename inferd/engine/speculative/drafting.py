"""Which sequences speculate each step, how far, and what came of it.

Runs on the step thread before the scheduler: a decoding sequence that may speculate gets a draft of up
to k tokens (fewer near its max_tokens or the context's end, none when the drafter has no guess). Not
drafted for, and so decoded one token per step as before: requests that opted out, and those whose next
token depends on more than the logits at its position (a grammar, penalties or a logit bias, whose
values would change with each kept draft) or that report log-probabilities per token.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from inferd.engine.base import SpeculationStats
from inferd.engine.sequence import Sequence

Method = Literal["ngram", "draft_model"]


@dataclass(frozen=True)
class Speculation:
    """A model's speculative decoding: `method`, up to `num_tokens` drafts a step; prompt lookup matches
    suffixes of `min_n` to `max_n` tokens; a draft model is the artifact at `draft_dir`."""

    method: Method = "ngram"
    num_tokens: int = 4
    min_n: int = 2
    max_n: int = 4
    draft_dir: str | None = None


class Proposer(Protocol):
    def propose_all(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Up to ks[i] draft tokens for each of `seqs` (decoding: one token not computed yet)."""
        ...


@dataclass
class SpeculationCounters:
    """Since start: draft tokens scheduled, those the target kept, and rows verified (a sequence's step
    with a draft: it produced its kept drafts and one token of the target's own)."""

    drafted: int = 0
    kept: int = 0
    rows: int = 0


def may_speculate(seq: Sequence) -> bool:
    """Whether drafts for this request could be verified by the logits at their positions alone."""
    p = seq.sampling
    return (p.speculative and seq.grammar is None and p.logprobs is None and not p.adjusts_logits
            and seq.engine_state is not None and not seq.engine_state.wants_logprobs)


class Speculator:
    """Drafts for the step engine's running sequences (step thread) and counts the outcome."""

    def __init__(self, settings: Speculation, proposer: Proposer, max_model_len: int) -> None:
        self.settings = settings
        self.proposer = proposer
        self.max_model_len = max_model_len
        self._lock = threading.Lock()            # counters: written on the step thread, read by metrics
        self._counters = SpeculationCounters()

    def draft(self, running: Iterable[Sequence]) -> None:
        """Set `draft` on each running decoding sequence that may speculate (step thread, before schedule)."""
        seqs, ks = [], []
        k = self.settings.num_tokens
        for seq in running:
            if seq.num_computed_tokens != seq.num_tokens - 1 or not seq.num_completion_tokens \
                    or not may_speculate(seq):
                continue
            # the target's own token follows the drafts: max_tokens and the context bound drafts plus it
            room = min(k, seq.sampling.max_tokens - seq.num_completion_tokens - 1,
                       self.max_model_len - seq.num_tokens - 1)
            if room > 0:
                seqs.append(seq)
                ks.append(room)
        if seqs:
            for seq, draft in zip(seqs, self.proposer.propose_all(seqs, ks)):
                seq.draft = draft

    def record(self, drafted: int, kept: int, rows: int) -> None:
        """Count a step's verification: `rows` sequences had `drafted` draft tokens, of which it kept `kept`."""
        with self._lock:
            c = self._counters
            c.drafted += drafted
            c.kept += kept
            c.rows += rows

    def stats(self) -> SpeculationStats:
        with self._lock:
            c = self._counters
            return SpeculationStats(draft_tokens=c.drafted, accepted_tokens=c.kept, verifications=c.rows)


def make_speculator(settings: Speculation, engine, max_model_len: int) -> Speculator:
    """The speculator a step engine's settings ask for (on its loader thread: a draft model loads here)."""
    if settings.method == "ngram":
        from inferd.engine.speculative.ngram import NgramProposer

        return Speculator(settings, NgramProposer(min_n=settings.min_n, max_n=settings.max_n), max_model_len)
    if settings.method == "draft_model" and engine.backend in ("reference", "torch"):
        # the runner's draft model guesses them, in the step (inferd.engine.speculative.draft_model)
        return Speculator(settings, Placeholders(), max_model_len)
    raise ValueError(f"speculative method {settings.method!r} is not available on the {engine.backend} engine")


class Placeholders:
    """Room for k guesses per sequence, which the runner's draft model fills in before the forward pass."""

    @staticmethod
    def propose_all(seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [[0] * k for k in ks]

"""The scheduler's second half (a mixin of inferd.engine.scheduler.Scheduler): after the model ran a step,
take its sampled tokens back, and the drafts it kept, and end sequences on token-level conditions.
"""
from __future__ import annotations

from inferd.engine.sequence import Sequence, SequenceStatus
from inferd.engine.step_output import SchedulerOutput
from inferd.types import FinishReason


class StepUpdate:
    """Uses the Scheduler's block_manager, eos_token_ids, max_model_len and finish()."""

    def update_from_output(self, out: SchedulerOutput, sampled: list[int],
                           kept: list[list[int]] | None = None) -> list[tuple[Sequence, int]]:
        """Advance the step's sequences; `sampled[j]` is the token for row `out.sample_rows[j]`, after the
        drafts `kept[j]` of that row the model agreed with (None: no row had a draft).

        Returns (sequence, tokens it received) for those that received any, in sample-row order. Those
        that finished on a token-level condition (EOS, stop token, max_tokens, context length) are
        FINISHED with their blocks freed; a draft token that finishes a sequence is its last.
        """
        self.advance(out)
        produced: list[tuple[Sequence, int]] = []
        for j, (row, token) in enumerate(zip(out.sample_rows, sampled)):
            seq = out.seqs[row]
            count = 0
            if kept is not None and seq.draft:
                count, finished = self._take_draft(seq, kept[j])
                if finished:
                    produced.append((seq, count))
                    continue
            seq.token_ids.append(token)
            produced.append((seq, count + 1))
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
        return produced

    def _take_draft(self, seq: Sequence, kept: list[int]) -> tuple[int, bool]:
        """Append the drafts the model kept (their K/V is computed); (how many, whether one finished it)."""
        seq.draft = []
        for count, token in enumerate(kept, 1):
            seq.token_ids.append(token)
            seq.num_computed_tokens += 1
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
                return count, True
        if kept and self.block_manager.prefix_caching and seq.status is SequenceStatus.RUNNING:
            self.block_manager.register_computed_blocks(seq)
        return len(kept), False

    def advance(self, out: SchedulerOutput) -> None:
        """The step ran: its sequences (those not finished meanwhile) have their new tokens' K/V (a draft's
        count only once the model kept it: update_from_output)."""
        register = self.block_manager.register_computed_blocks if self.block_manager.prefix_caching else None
        running = SequenceStatus.RUNNING
        for seq, n in zip(out.seqs, out.num_new_tokens):
            if seq.status is running:       # not finished nor parked meanwhile
                seq.num_computed_tokens += n - len(seq.draft) if seq.draft else n
                if register is not None:
                    register(seq)

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.sampling
        if seq.grammar is not None and seq.grammar.failed:   # first: a dead end's sampled token may be an EOS
            return FinishReason.ERROR
        if token in params.stop_token_ids:
            return FinishReason.STOP
        if not params.ignore_eos and token in self.eos_token_ids:
            return FinishReason.STOP
        grammar = seq.grammar
        if grammar is not None:     # it ended (even on an EOS that ignore_eos lets through), or it cannot go on
            if grammar.terminated:
                return FinishReason.STOP
        if seq.num_completion_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

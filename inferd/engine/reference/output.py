"""One request's output side in the reference engine: what turns sampled token ids into its stream.

The step thread owns it (as Sequence.engine_state): it detokenizes incrementally, holds back text
that may start a stop string, stamps timing, and builds the deltas, final ones with usage and timing.
"""
from __future__ import annotations

from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import IncrementalDetokenizer, StopMatcher
from inferd.engine.sequence import Sequence
from inferd.types import Delta, EngineTiming, FinishReason, Usage


class RequestOutput:
    """One request's output side: its stream, detokenizer, stop matcher and timing stamps."""

    __slots__ = ("stream", "submitted", "first_scheduled", "first_token", "detok", "stop")

    def __init__(self, stream: RequestStream, submitted: float) -> None:
        self.stream = stream
        self.submitted = submitted
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.detok: IncrementalDetokenizer | None = None
        self.stop: StopMatcher | None = None

    def start(self, tokenizer, seq: Sequence) -> None:
        """Step thread, when the request is taken: the detokenizer decodes prompt context."""
        self.detok = IncrementalDetokenizer(tokenizer, seq.token_ids)
        self.stop = StopMatcher(seq.sampling.stop) if seq.sampling.stop else None

    def on_token(self, seq: Sequence, now: float) -> tuple[Delta, bool]:
        """The delta for seq's newest token, and whether a stop string ended the text there.

        A stop token (EOS or stop_token_ids) is counted and returned as an id, never as text.
        """
        if self.first_token is None:
            self.first_token = now
        token = seq.token_ids[-1]
        finished = seq.finished
        text = "" if finished and seq.finish_reason is FinishReason.STOP else self.detok.push((token,))
        if finished:
            text += self.detok.flush()
        hit = False
        if self.stop is not None:
            text, hit = self.stop.push(text)
            if finished and not hit:
                text += self.stop.flush()
        if hit:
            seq.finish_reason = FinishReason.STOP
        elif not finished:
            return Delta(token_ids=[token], text=text), False
        return Delta(token_ids=[token], text=text, finish_reason=FinishReason.STOP if hit else seq.finish_reason,
                     usage=self.usage(seq), timing=self.timing(now)), hit

    def final(self, seq: Sequence, reason: FinishReason, now: float, error: str | None = None) -> Delta:
        return Delta(token_ids=[], finish_reason=reason, usage=self.usage(seq), timing=self.timing(now), error=error)

    @staticmethod
    def usage(seq: Sequence) -> Usage:
        return Usage(prompt_tokens=seq.num_prompt_tokens, completion_tokens=seq.num_completion_tokens,
                     cached_tokens=seq.num_cached_tokens)

    def timing(self, now: float) -> EngineTiming:
        return EngineTiming(submitted=self.submitted, first_scheduled=self.first_scheduled,
                            first_token=self.first_token, finished=now)

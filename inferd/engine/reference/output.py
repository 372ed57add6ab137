"""One request's output side in the reference engine: what turns sampled token ids into its stream.

The step thread owns it (as Sequence.engine_state): it detokenizes incrementally, holds back text
that may start a stop string, stamps timing, and builds the deltas, final ones with usage and timing.
"""
from __future__ import annotations

import numpy as np

from inferd.engine.grammar import DEAD_END
from inferd.engine.reference.sampler import token_logprobs
from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import IncrementalDetokenizer, StopMatcher
from inferd.engine.sequence import Sequence
from inferd.types import Delta, EngineTiming, FinishReason, TokenLogprob, Usage



class RequestOutput:
    """One request's output side: its stream, detokenizer, stop matcher and timing stamps."""

    __slots__ = ("stream", "submitted", "first_scheduled", "first_token", "detok", "stop", "wants_logprobs",
                 "pending_logprob", "prompt_logprobs", "prompt_logprobs_sent")

    def __init__(self, stream: RequestStream, submitted: float) -> None:
        self.stream = stream
        self.submitted = submitted
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.detok: IncrementalDetokenizer | None = None
        self.stop: StopMatcher | None = None
        self.wants_logprobs = False
        self.pending_logprob: TokenLogprob | None = None         # the newest token's, until its delta
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.prompt_logprobs_sent = False

    def start(self, tokenizer, seq: Sequence) -> None:
        """Step thread, when the request is taken: the detokenizer decodes prompt context."""
        self.detok = IncrementalDetokenizer(tokenizer, seq.token_ids)
        self.stop = StopMatcher(seq.sampling.stop) if seq.sampling.stop else None
        sp = seq.sampling
        self.wants_logprobs = sp.logprobs is not None or sp.prompt_logprobs is not None
        if sp.prompt_logprobs is not None:
            self.prompt_logprobs = [None]         # the first prompt token has no context: null, as OpenAI

    def prompt_logits(self, seq: Sequence, start: int, logits: np.ndarray) -> None:
        """The logits at positions start.. of seq's prompt (one prefill chunk): the log-probabilities of
        the prompt tokens after them. A recomputed chunk (after a preemption) adds nothing twice."""
        done = self.prompt_logprobs
        lo = max(start, len(done) - 1)            # position j's logits score token j + 1
        hi = min(start + logits.shape[0], seq.num_prompt_tokens - 1)
        if lo < hi:
            k = seq.sampling.prompt_logprobs
            done.extend(token_logprobs(logits[lo - start:hi - start], seq.token_ids[lo + 1:hi + 1], [k] * (hi - lo)))

    def _attach_logprobs(self, delta: Delta) -> Delta:
        if self.pending_logprob is not None:
            delta.logprobs, self.pending_logprob = [self.pending_logprob], None
        if self.prompt_logprobs is not None and not self.prompt_logprobs_sent:
            delta.prompt_logprobs, self.prompt_logprobs_sent = self.prompt_logprobs, True
        return delta

    def on_token(self, seq: Sequence, now: float, count: int = 1) -> tuple[Delta, bool]:
        """The delta for seq's newest `count` tokens (more than one: drafts the model kept, then its own),
        and whether a stop string ended the text there. A stop string inside them ends the sequence at the
        token that completed it: the tokens after it are dropped, as decoding one at a time never made them.

        A stop token (EOS or stop_token_ids) is counted and returned as an id, never as text.
        """
        if self.first_token is None:
            self.first_token = now
        finished = seq.finished
        tokens = seq.token_ids[-count:]
        text, hit = "", False
        for i, token in enumerate(tokens):
            last = i == count - 1
            # a stop token is not text; nor is the token a grammar's dead end sampled (from no allowed token)
            piece = "" if last and finished and seq.finish_reason in (FinishReason.STOP, FinishReason.ERROR) \
                else self.detok.push((token,))
            if last and finished:
                piece += self.detok.flush()
            if self.stop is not None:
                piece, hit = self.stop.push(piece)
                if last and finished and not hit:
                    piece += self.stop.flush()
            text += piece
            if hit:
                if not last:
                    del seq.token_ids[len(seq.token_ids) - (count - 1 - i):]
                    tokens = tokens[:i + 1]
                seq.finish_reason = FinishReason.STOP
                break
        if not hit and not finished:
            delta = Delta(token_ids=tokens, text=text)
            return (self._attach_logprobs(delta) if self.wants_logprobs else delta), False
        reason = FinishReason.STOP if hit else seq.finish_reason
        delta = Delta(token_ids=tokens, text=text, finish_reason=reason, usage=self.usage(seq), timing=self.timing(now),
                      error=DEAD_END if reason is FinishReason.ERROR else None)
        return (self._attach_logprobs(delta) if self.wants_logprobs else delta), hit

    def final(self, seq: Sequence, reason: FinishReason, now: float, error: str | None = None) -> Delta:
        return Delta(token_ids=[], finish_reason=reason, usage=self.usage(seq), timing=self.timing(now), error=error)

    @staticmethod
    def usage(seq: Sequence) -> Usage:
        return Usage(prompt_tokens=seq.num_prompt_tokens, completion_tokens=seq.num_completion_tokens,
                     cached_tokens=seq.num_cached_tokens)

    def timing(self, now: float) -> EngineTiming:
        return EngineTiming(submitted=self.submitted, first_scheduled=self.first_scheduled,
                            first_token=self.first_token, finished=now)

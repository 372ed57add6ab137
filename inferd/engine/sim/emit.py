"""The simulated engine's step output: turn a step's scheduled sequences into tokens and stream pushes.

Each sequence whose context is now fully computed gets one synthetic token, a deterministic function
of (key, position), or the one its grammar allows (sim.guided). Plain sequences (no grammar, stop
strings or log-probabilities: nearly all) take a short path, the only per-token Python a GPU engine
would not run; the rest, and every sequence's last token, go through _emit (stop strings, UTF-8 of
byte tokens, synthetic log-probabilities). Ending a sequence is the engine's `finish`: it releases
the slot and blocks, which this module does not own.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from inferd.engine.grammar import DEAD_END
from inferd.engine.sim.guided import GuidedChooser
from inferd.engine.sim.logprobs import synthetic_logprob, synthetic_prompt_logprobs
from inferd.engine.sim.profiles import SimTokenizer
from inferd.engine.sim.scheduler import SimSequence
from inferd.types import Delta, FinishReason

EOS_SCALE = 1 << 20   # eos_threshold is a probability in 1/EOS_SCALE units

# finish(seq, reason, token_ids, text, error=None, lp=None): release the sequence and end its stream
Finish = Callable[..., None]


class StepOutput:
    """Makes each step's tokens and pushes them to their streams; `finish` ends a sequence (the engine's)."""

    def __init__(self, tokenizer: SimTokenizer, finish: Finish) -> None:
        self.tokenizer = tokenizer
        self._chooser = GuidedChooser(tokenizer)
        self._finish = finish
        self._pieces = tokenizer.pieces()     # each id's text, by id (specials and bytes: "")

    def complete(self, scheduled: list) -> int:
        """One new token for every sequence of `scheduled` whose context is now fully computed (the
        scheduler has been told the step is computed); returns how many tokens were made."""
        gen_ids = self.tokenizer.generation_ids
        num_gen = len(gen_ids)
        pieces = self._pieces
        eos = self.tokenizer.eos_token_ids[0]
        now = time.monotonic()
        produced = 0
        for seq, _ in scheduled:
            if seq.done:
                continue   # aborted while the step ran
            token_ids = seq.token_ids
            n = len(token_ids)
            if seq.num_computed_tokens < n:
                continue   # a prefill chunk: no token yet
            pos = n - seq.num_prompt_tokens
            if not seq.plain:
                if seq.grammar is not None:
                    token = self._guided_token(seq, pos)
                    if token is None:
                        self._finish(seq, FinishReason.ERROR, [], "", error=DEAD_END)
                        continue
                else:
                    token = self._free_token(seq, pos, gen_ids, num_gen)
                token_ids.append(token)
                produced += 1
                if seq.first_token is None:
                    seq.first_token = now
                self._emit(seq, token, pos)
                continue
            key = seq.key
            token = gen_ids[hash((key, pos)) % num_gen]
            if seq.eos_threshold and hash((key, pos, 2)) % EOS_SCALE < seq.eos_threshold:
                token = eos
            token_ids.append(token)
            produced += 1
            if seq.first_token is None:
                seq.first_token = now
            if token in seq.stop_ids or pos + 1 >= seq.max_tokens:
                self._emit(seq, token, pos)
            else:   # a generated word or punctuation (never a byte token): its piece is its text
                seq.stream.push_token(token, pieces[token])
        return produced

    def _free_token(self, seq: SimSequence, pos: int, gen_ids: tuple[int, ...], num_gen: int) -> int:
        """The token at `pos` of a sequence without a grammar: a function of (key, pos) only."""
        key = seq.key
        if seq.eos_threshold and hash((key, pos, 2)) % EOS_SCALE < seq.eos_threshold:
            return self.tokenizer.eos_token_ids[0]
        return gen_ids[hash((key, pos)) % num_gen]

    def _guided_token(self, seq: SimSequence, pos: int) -> int | None:
        """A token the sequence's grammar allows (sim.guided), fed to it; None when it allows none."""
        token = self._chooser.choose(seq.grammar, seq.key, pos)
        if token is None or not seq.grammar.accept(token):
            return None
        return token

    def _emit(self, seq: SimSequence, token: int, pos: int) -> None:
        """Push `token` (already appended to the sequence) with its text, or end the sequence on it."""
        lp = self._logprobs(seq, token, pos) if seq.logprobs is not None or seq.prompt_logprobs is not None \
            else None
        if token in seq.stop_ids or (seq.grammar is not None and seq.grammar.terminated):
            text = seq.utf8.decode(b"", final=True)
            if seq.matcher is not None:
                text = seq.matcher.push(text)[0] + seq.matcher.flush()
            self._finish(seq, FinishReason.STOP, [token], text, lp=lp)
            return
        text = self._text(seq, token, self.tokenizer.first_piece)
        if seq.matcher is not None:
            text, stopped = seq.matcher.push(text)
            if stopped:
                self._finish(seq, FinishReason.STOP, [token], text, lp=lp)
                return
        if pos + 1 >= seq.max_tokens:
            tail = seq.utf8.decode(b"", final=True)       # a character cut short by max_tokens: U+FFFD
            text += tail if seq.matcher is None else seq.matcher.push(tail)[0] + seq.matcher.flush()
            self._finish(seq, FinishReason.LENGTH, [token], text, lp=lp)
            return
        if lp is None:
            seq.stream.push_token(token, text)
        else:
            seq.stream.push(Delta(token_ids=[token], text=text, **lp))

    def _text(self, seq: SimSequence, token: int, first_piece: int) -> str:
        """The text `token` adds. Byte tokens (ids below first_piece) go through the sequence's incremental
        UTF-8 decoder: decoding each alone turned every byte of a multi-byte character into U+FFFD."""
        if token >= first_piece:
            held = seq.utf8.decode(b"", final=True)        # bytes of a character cut short: U+FFFD, as HF
            return held + self.tokenizer.piece(token) if held else self.tokenizer.piece(token)
        return seq.utf8.decode(self.tokenizer.token_bytes_of(token))

    def _logprobs(self, seq: SimSequence, token: int, pos: int) -> dict | None:
        """The synthetic log-probabilities a token's delta carries (sim.logprobs), for requests that asked."""
        if seq.logprobs is None and seq.prompt_logprobs is None:
            return None
        vocab = self.tokenizer.generation_ids
        out: dict = {}
        if seq.logprobs is not None:
            out["logprobs"] = [synthetic_logprob(seq.key, pos, token, seq.logprobs, vocab)]
        if seq.prompt_logprobs is not None:
            out["prompt_logprobs"] = synthetic_prompt_logprobs(seq.token_ids[:seq.num_prompt_tokens],
                                                               seq.prompt_logprobs, vocab)
            seq.prompt_logprobs = None
        return out

"""The output post-filter: a request's stream with its text held back and searched before it is sent.

`FilteredStream` wraps an admitted stream (same consumer interface: take/listen/ready/cancel/collect,
async iteration) and keeps the last `hold_back_chars` of generated text unsent until more arrives or
the generation ends. Each read searches the held text plus the new text; on a match the engine
request is cancelled (aborted, its KV freed, admission settled), nothing from the match on is ever
sent, and the stream ends with finish_reason CONTENT_FILTER carrying the text before the match.
Tokens still travel with their deltas, so usage and billing count what the engine generated.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferd.engine import StreamWrapper
from inferd.safety.rules import RuleMatch, RuleSet
from inferd.types import Delta, FinishReason, Usage

SEARCH_TAIL_CHARS = 256     # sent text searched again with new text: matches up to this long are still stopped


class FilteredStream(StreamWrapper):
    def __init__(self, inner: Any, rules: RuleSet, hold_back_chars: int, prompt_tokens: int,
                 on_match: Callable[[RuleMatch], None]) -> None:
        super().__init__(inner)
        self._rules = rules
        self._hold = hold_back_chars
        self._prompt_tokens = prompt_tokens
        self._on_match = on_match
        self._held = ""
        self._sent_tail = ""        # the last SEARCH_TAIL_CHARS characters already sent
        self._stopped = False

    @property
    def _ended(self) -> bool:
        return self._stopped

    # -- the filter -------------------------------------------------------------------------
    def _read(self, delta: Delta) -> Delta | None:
        unsent = self._held + delta.text
        # The last sent characters are searched too: a match longer than the hold-back window is still
        # caught (and the rest of it never sent), though its first characters went out.
        match = self._rules.search(self._sent_tail + unsent)
        if match is not None:
            self._stopped = True
            self._held = ""
            self._inner.cancel()            # abort the engine request now: its KV is freed, admission settles
            self._on_match(match)
            usage = delta.usage or Usage(prompt_tokens=self._prompt_tokens,
                                         completion_tokens=self._inner.delivered_tokens)
            safe = unsent[:max(0, match.start - len(self._sent_tail))]
            return Delta(token_ids=delta.token_ids, text=safe, finish_reason=FinishReason.CONTENT_FILTER,
                         usage=usage, timing=delta.timing)
        if delta.finish_reason is not None:
            self._held = ""
            return Delta(token_ids=delta.token_ids, text=unsent, finish_reason=delta.finish_reason,
                         usage=delta.usage, timing=delta.timing, error=delta.error)
        cut = max(0, len(unsent) - self._hold)
        self._held = unsent[cut:]
        if cut == 0 and not delta.token_ids:
            return None
        self._sent_tail = (self._sent_tail + unsent[:cut])[-SEARCH_TAIL_CHARS:]
        return Delta(token_ids=delta.token_ids, text=unsent[:cut])

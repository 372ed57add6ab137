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

from inferd.engine import merge_deltas
from inferd.safety.rules import RuleMatch, RuleSet
from inferd.types import Delta, FinishReason, Usage

SEARCH_TAIL_CHARS = 256     # sent text searched again with new text: matches up to this long are still stopped


class FilteredStream:
    def __init__(self, inner: Any, rules: RuleSet, hold_back_chars: int, prompt_tokens: int,
                 on_match: Callable[[RuleMatch], None]) -> None:
        self._inner = inner
        self._rules = rules
        self._hold = hold_back_chars
        self._prompt_tokens = prompt_tokens
        self._on_match = on_match
        self._held = ""
        self._sent_tail = ""        # the last SEARCH_TAIL_CHARS characters already sent
        self._stopped = False
        self.request_id = inner.request_id
        self.tenant = getattr(inner, "tenant", None)

    # -- what the writers call ------------------------------------------------------------
    def take(self) -> Delta | None:
        if self._stopped:
            return None
        delta = self._inner.take()
        return None if delta is None else self._filter(delta)

    def __aiter__(self) -> FilteredStream:
        return self

    async def __anext__(self) -> Delta:
        while not self._stopped:
            out = self._filter(await self._inner.__anext__())
            if out is not None:
                return out
        raise StopAsyncIteration

    async def collect(self) -> Delta:
        return merge_deltas([d async for d in self])

    def listen(self, listener: Callable[[], None] | None) -> None:
        self._inner.listen(listener)

    def ready(self) -> bool:
        return not self._stopped and self._inner.ready()

    @property
    def finished(self) -> bool:
        return self._stopped or self._inner.finished

    @property
    def delivered_tokens(self) -> int:
        return self._inner.delivered_tokens

    def cancel(self) -> None:
        self._inner.cancel()

    # -- the filter -------------------------------------------------------------------------
    def _filter(self, delta: Delta) -> Delta | None:
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

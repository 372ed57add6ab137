"""Streams for the response cache: one that replays a stored generation, one that records a new one.

`ReplayStream` has the consumer interface of an admitted stream and hands out the stored Delta once,
whole, with fresh timing stamps (a hit has no queue, no prefill). `RecordingStream` wraps an admitted
stream and keeps the text and token ids its consumer reads, so a streamed miss can be stored whole.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from inferd.engine import StreamWrapper, add_logprobs, merge_deltas
from inferd.types import Delta, EngineTiming, Usage


class ReplayStream:
    def __init__(self, request_id: str, stored: Delta) -> None:
        now = time.monotonic()
        usage = stored.usage or Usage(prompt_tokens=0, completion_tokens=len(stored.token_ids))
        self.request_id = request_id
        self._delta: Delta | None = Delta(
            token_ids=list(stored.token_ids), text=stored.text, finish_reason=stored.finish_reason,
            usage=Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                        cached_tokens=usage.prompt_tokens),           # the whole prompt was served from cache
            timing=EngineTiming(submitted=now, first_scheduled=now, first_token=now, finished=now),
            logprobs=stored.logprobs, prompt_logprobs=stored.prompt_logprobs)
        self._tokens = len(stored.token_ids)
        self._taken = False

    def take(self) -> Delta | None:
        delta, self._delta = self._delta, None
        if delta is not None:
            self._taken = True
        return delta

    def __aiter__(self) -> ReplayStream:
        return self

    async def __anext__(self) -> Delta:
        delta = self.take()
        if delta is None:
            raise StopAsyncIteration
        return delta

    async def collect(self) -> Delta:
        return merge_deltas([d async for d in self])

    def listen(self, listener: Callable[[], None] | None) -> None:
        pass                            # everything is ready at once: the writer's first flush takes it

    def ready(self) -> bool:
        return self._delta is not None

    @property
    def finished(self) -> bool:
        return True

    @property
    def delivered_tokens(self) -> int:
        return self._tokens if self._taken else 0

    def cancel(self) -> None:
        self._delta = None


class RecordingStream(StreamWrapper):
    """`inner`, unchanged, with what its consumer read kept: `whole()` once it ended."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self._ids: list[int] = []
        self._texts: list[str] = []
        self._final: Delta | None = None
        self._lp = Delta(token_ids=[])           # log-probabilities read (requests that asked for them)

    def _read(self, delta: Delta) -> Delta:
        if delta.logprobs is not None or delta.prompt_logprobs is not None:
            add_logprobs(self._lp, delta)
        self._ids.extend(delta.token_ids)
        self._texts.append(delta.text)
        if delta.finish_reason is not None:
            self._final = delta
        return delta

    def whole(self) -> Delta | None:
        """The generation as one Delta, or None while it has not ended."""
        f = self._final
        if f is None:
            return None
        return Delta(token_ids=self._ids, text="".join(self._texts), finish_reason=f.finish_reason, usage=f.usage,
                     timing=f.timing, error=f.error, logprobs=self._lp.logprobs,
                     prompt_logprobs=self._lp.prompt_logprobs)

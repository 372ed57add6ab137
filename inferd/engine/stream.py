"""A request's output stream: the engine pushes deltas, the API pulls them, merged.

Engines call `push` on the event-loop thread (a threaded engine hands a whole step's deltas
to the loop with one `call_soon_threadsafe`). The consumer gets everything pushed since its
last read merged into one Delta, so when the engine outruns the client the client sees fewer,
larger deltas instead of an unbounded queue of small ones: memory is bounded by the request's
own output, never by how far behind the client is.

A consumer either awaits the stream (`async for`, one wake-up per read) or registers a listener
(`listen`) and reads with `take()`: the listener is called once each time the stream goes from
nothing pending to something pending, which lets one writer serve many streams without a task
wake-up per delta (the SSE front does this).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from inferd.types import Delta


def merge_deltas(deltas: list[Delta]) -> Delta:
    """Concatenate consecutive deltas of one stream; final fields come from the last."""
    if len(deltas) == 1:
        return deltas[0]
    token_ids: list[int] = []
    for d in deltas:
        token_ids.extend(d.token_ids)
    last = deltas[-1]
    merged = Delta(
        token_ids=token_ids,
        text="".join(d.text for d in deltas),
        finish_reason=last.finish_reason,
        usage=last.usage,
        timing=last.timing,
        error=last.error,
    )
    for d in deltas:
        if d.logprobs is not None or d.prompt_logprobs is not None:
            add_logprobs(merged, d)
    return merged


def add_logprobs(into: Delta, d: Delta) -> None:
    """Append d's log-probabilities to `into`'s (requests that asked for them only: never on the
    plain path). Prompt ones come once per stream, so the first seen is kept."""
    if d.logprobs is not None:
        if into.logprobs is None:
            into.logprobs = []
        into.logprobs.extend(d.logprobs)
    if d.prompt_logprobs is not None and into.prompt_logprobs is None:
        into.prompt_logprobs = d.prompt_logprobs


class RequestStream:
    """Async iterator of merged Deltas for one request. Loop-thread only.

    Pending output is kept as token ids and text pieces (plus the last delta pushed, whose final
    fields a merge keeps), so `push_token`, the engines' per-token path, builds no Delta at all.
    """

    __slots__ = ("request_id", "_ids", "_texts", "_last", "_count", "_waiter", "_listener", "_final_pushed",
                 "_final_read", "_on_cancel", "_lp", "_on_resumed")

    def __init__(self, request_id: str, on_cancel: Callable[[str], None] | None = None) -> None:
        self.request_id = request_id
        self._ids: list[int] = []
        self._texts: list[str] = []
        self._last: Delta | None = None       # the last push, when it was a whole Delta
        self._count = 0                       # pushes pending
        self._waiter: asyncio.Future[None] | None = None
        self._listener: Callable[[], None] | None = None
        self._final_pushed = False
        self._final_read = False
        self._on_cancel = on_cancel
        self._lp: Delta | None = None         # log-probabilities pending (requests that asked only)
        self._on_resumed: Callable[[], None] | None = None

    # -- producer side (engine) --------------------------------------------------------
    def push(self, delta: Delta) -> None:
        if self._final_pushed:
            return  # nothing follows a final delta (e.g. an abort racing a natural finish)
        self._ids.extend(delta.token_ids)
        self._texts.append(delta.text)
        self._last = delta
        if delta.logprobs is not None or delta.prompt_logprobs is not None:
            if self._lp is None:
                self._lp = Delta(token_ids=[])
            add_logprobs(self._lp, delta)
        if delta.finish_reason is not None:
            self._final_pushed = True
        self._count += 1
        if self._count == 1:
            self._notify()

    def push_token(self, token_id: int, text: str) -> None:
        """`push(Delta(token_ids=[token_id], text=text))`, without building the Delta."""
        if self._final_pushed:
            return
        self._ids.append(token_id)
        self._texts.append(text)
        self._last = None
        self._count += 1
        if self._count == 1:
            self._notify()

    def resumed(self) -> None:
        """The engine says: the sequence that yielded its slot (Engine.yield_slot) holds one again, or the
        yield was never applied. Told at once, not inferred from output: a step in flight when the yield
        was asked, and output already buffered, still deliver tokens after it."""
        if self._on_resumed is not None:
            self._on_resumed()

    def on_resumed(self, callback: Callable[[], None] | None) -> None:
        self._on_resumed = callback

    def _notify(self) -> None:
        # Only on the first push since the last read: the consumer has not read yet after that.
        listener = self._listener
        if listener is not None:
            listener()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def finished(self) -> bool:
        """True once the engine has pushed the final delta."""
        return self._final_pushed

    # -- consumer side (API) -----------------------------------------------------------
    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        if not self._count:
            if self._final_read:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.take()

    def ready(self) -> bool:
        """A delta can be read without waiting."""
        return self._count > 0

    async def collect(self) -> Delta:
        """Wait for the whole output and return it as one Delta (non-streaming responses)."""
        parts = [d async for d in self]
        return merge_deltas(parts)

    def take(self) -> Delta | None:
        """Everything pending, merged, without waiting; None when nothing is."""
        count = self._count
        if not count:
            return None
        last = self._last
        if count == 1 and last is not None:
            delta = last                      # one whole Delta pushed: handed over as it is
        elif last is None:
            delta = Delta(token_ids=self._ids, text=self._texts[0] if count == 1 else "".join(self._texts))
        else:
            delta = Delta(token_ids=self._ids, text="".join(self._texts), finish_reason=last.finish_reason,
                          usage=last.usage, timing=last.timing, error=last.error)
        lp = self._lp
        if lp is not None:
            self._lp = None
            if delta is not last:
                delta.logprobs, delta.prompt_logprobs = lp.logprobs, lp.prompt_logprobs
        self._ids = []
        self._texts = []
        self._last = None
        self._count = 0
        if delta.finish_reason is not None:
            self._final_read = True
        return delta

    def take_text(self) -> tuple[int, str] | None:
        """take() of plain output (pushed with push_token only: token ids and text), as (token count, text),
        without building a Delta. None when nothing is pending, or when a whole Delta was pushed since the
        last read (a final one, log-probabilities): then take() reads it."""
        count = self._count
        if not count or self._last is not None or self._lp is not None:
            return None
        texts = self._texts
        out = (len(self._ids), texts[0] if count == 1 else "".join(texts))
        self._ids = []
        self._texts = []
        self._count = 0
        return out

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call `listener()` whenever a delta arrives while nothing is pending (None: stop)."""
        self._listener = listener

    def cancel(self) -> None:
        """The consumer is going away: ask the engine to abort, unless already finished."""
        if not self._final_pushed and self._on_cancel is not None:
            on_cancel, self._on_cancel = self._on_cancel, None
            on_cancel(self.request_id)


class StreamWrapper:
    """A stream with the consumer interface of the one it wraps (an admitted stream, or another
    wrapper), every call passed through. A subclass rewrites what is read by overriding `_read`
    (None: nothing to hand out yet) and says when it will hand out nothing more with `_ended`:
    the safety filters and the response cache's recorder are such wrappers."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.request_id = inner.request_id
        self.tenant = getattr(inner, "tenant", None)

    def _read(self, delta: Delta) -> Delta | None:
        return delta

    @property
    def _ended(self) -> bool:
        return False

    def take(self) -> Delta | None:
        if self._ended:
            return None
        delta = self._inner.take()
        return None if delta is None else self._read(delta)

    def __aiter__(self) -> StreamWrapper:
        return self

    async def __anext__(self) -> Delta:
        while not self._ended:
            out = self._read(await self._inner.__anext__())
            if out is not None:
                return out
        raise StopAsyncIteration

    async def collect(self) -> Delta:
        return merge_deltas([d async for d in self])

    def listen(self, listener: Callable[[], None] | None) -> None:
        self._inner.listen(listener)

    def ready(self) -> bool:
        return not self._ended and self._inner.ready()

    @property
    def finished(self) -> bool:
        return self._ended or self._inner.finished

    @property
    def delivered_tokens(self) -> int:
        return self._inner.delivered_tokens

    def cancel(self) -> None:
        self._inner.cancel()

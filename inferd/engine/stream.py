"""A request's output stream: the engine pushes deltas, the API pulls them, merged.

Engines call `push` on the event-loop thread (a threaded engine hands a whole step's deltas
to the loop with one `call_soon_threadsafe`). The consumer gets everything pushed since its
last read merged into one Delta, so when the engine outruns the client the client sees fewer,
larger deltas instead of an unbounded queue of small ones: memory is bounded by the request's
own output, never by how far behind the client is.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from inferd.types import Delta


def merge_deltas(deltas: list[Delta]) -> Delta:
    """Concatenate consecutive deltas of one stream; final fields come from the last."""
    if len(deltas) == 1:
        return deltas[0]
    token_ids: list[int] = []
    for d in deltas:
        token_ids.extend(d.token_ids)
    last = deltas[-1]
    return Delta(
        token_ids=token_ids,
        text="".join(d.text for d in deltas),
        finish_reason=last.finish_reason,
        usage=last.usage,
        timing=last.timing,
        error=last.error,
    )


class RequestStream:
    """Async iterator of merged Deltas for one request. Loop-thread only."""

    __slots__ = ("request_id", "_pending", "_waiter", "_final_pushed", "_final_read", "_on_cancel")

    def __init__(self, request_id: str, on_cancel: Callable[[str], None] | None = None) -> None:
        self.request_id = request_id
        self._pending: list[Delta] = []
        self._waiter: asyncio.Future[None] | None = None
        self._final_pushed = False
        self._final_read = False
        self._on_cancel = on_cancel

    # -- producer side (engine) --------------------------------------------------------
    def push(self, delta: Delta) -> None:
        if self._final_pushed:
            return  # nothing follows a final delta (e.g. an abort racing a natural finish)
        self._pending.append(delta)
        if delta.finish_reason is not None:
            self._final_pushed = True
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
        if not self._pending:
            if self._final_read:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        delta = merge_deltas(self._pending)
        self._pending = []
        if delta.finish_reason is not None:
            self._final_read = True
        return delta

    def ready(self) -> bool:
        """A delta can be read without waiting."""
        return bool(self._pending)

    async def collect(self) -> Delta:
        """Wait for the whole output and return it as one Delta (non-streaming responses)."""
        parts = [d async for d in self]
        return merge_deltas(parts)

    def cancel(self) -> None:
        """The consumer is going away: ask the engine to abort, unless already finished."""
        if not self._final_pushed and self._on_cancel is not None:
            on_cancel, self._on_cancel = self._on_cancel, None
            on_cancel(self.request_id)

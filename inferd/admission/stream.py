"""AdmittedStream: an admitted request's engine stream with admission's bookkeeping on top.

While the request runs its stream charges the output it delivers to the tenant's virtual token counter,
so long generations count against the tenant while they run, not only after they end. It charges in
steps of CHARGE_EVERY_TOKENS tokens, not per delta: a streaming response reads one delta per SSE frame,
and charging (counters, tenant lookup, stats, rate meter) cost several times the frame's other
admission work; counting tokens is all a frame does now. A running stream never owes more than
CHARGE_EVERY_TOKENS * output_cost_weight, small beside a request's prompt cost. The first token is
charged at once (TTFT, and it wakes the dispatcher: the prompt's prefill is done), and the end settles
the exact total (the final usage, or what was delivered when the consumer cancels).

It also enforces the deadline: engine.abort, then the final delta's finish_reason is DEADLINE. When
it ends (or its consumer cancels it) it hands everything back to the queue, which releases the quota
lease.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from inferd.admission.ticket import Ticket
from inferd.engine import Engine, RequestStream, merge_deltas
from inferd.types import Delta, FinishReason, Usage

CHARGE_EVERY_TOKENS = 16


class StreamOwner(Protocol):
    """What a running stream reports back to its admission queue (inferd.admission.fair_queue.AdmissionQueue)."""

    engine: Engine

    def first_token(self, t: Ticket) -> None: ...

    def resumed(self, t: Ticket) -> None: ...

    def charge_output(self, t: Ticket, n: int) -> None: ...

    def stream_ended(self, t: Ticket, usage: Usage, complete: bool) -> None: ...


class AdmittedStream:
    """Same consumer interface as RequestStream."""

    def __init__(self, queue: StreamOwner, ticket: Ticket, stream: RequestStream, queue_wait_s: float,
                 deadline_in_s: float | None) -> None:
        """`deadline_in_s`: loop seconds until the deadline (None: none)."""
        self._queue = queue
        self._ticket = ticket
        self._stream = stream
        self.request_id = stream.request_id
        self.tenant = ticket.tenant
        self.queue_wait_s = queue_wait_s
        self.deadline_hit = False
        self._output = 0                  # tokens delivered to the consumer
        self._charged = 0                 # of them, charged to the tenant
        self._charge_at = 1               # charge (and note the first token) once _output reaches this
        self._closed = False
        self._deadline_timer: asyncio.TimerHandle | None = None
        # The engine tells when a yielded sequence holds a slot again (RequestStream.resumed).
        stream.on_resumed(lambda: queue.resumed(ticket))
        if deadline_in_s is not None:
            self._deadline_timer = asyncio.get_running_loop().call_later(deadline_in_s, self._on_deadline)

    def __aiter__(self) -> AdmittedStream:
        return self

    async def __anext__(self) -> Delta:
        delta = await self._stream.__anext__()
        self._delivered(delta)
        return delta

    def take(self) -> Delta | None:
        """RequestStream.take with the same bookkeeping (for a writer that reads on a listener)."""
        delta = self._stream.take()
        if delta is not None:
            self._delivered(delta)
        return delta

    def take_text(self) -> tuple[int, str] | None:
        """RequestStream.take_text with the same bookkeeping: (token count, text) of plain output, or None
        (nothing pending, or a whole Delta: take() reads it)."""
        got = self._stream.take_text()
        if got is not None:
            self._output += got[0]
            if self._output >= self._charge_at:
                self._charge()
        return got

    def _delivered(self, delta: Delta) -> None:
        # Once per read: only count, unless a charge step is reached or the stream ends.
        self._output += len(delta.token_ids)
        if self._output >= self._charge_at or delta.finish_reason is not None:
            self._account(delta)

    def listen(self, listener: Callable[[], None] | None) -> None:
        self._stream.listen(listener)

    def _charge(self) -> None:
        if self._output and not self._charged:
            self._queue.first_token(self._ticket)
        if self._output > self._charged:
            self._queue.charge_output(self._ticket, self._output - self._charged)
            self._charged = self._output
        self._charge_at = self._output + CHARGE_EVERY_TOKENS

    def _account(self, delta: Delta) -> None:
        self._charge()
        if delta.finish_reason is not None:
            if self.deadline_hit and delta.finish_reason is FinishReason.ABORT:
                delta.finish_reason = FinishReason.DEADLINE
            self._close(delta.usage)

    async def collect(self) -> Delta:
        return merge_deltas([d async for d in self])

    def ready(self) -> bool:
        return self._stream.ready()

    @property
    def finished(self) -> bool:
        return self._stream.finished

    @property
    def delivered_tokens(self) -> int:
        """Output tokens handed to the consumer so far (what an abandoned stream is billed for)."""
        return self._output

    def cancel(self) -> None:
        """The consumer is going away: abort in the engine and give back everything held."""
        self._stream.cancel()
        self._close(None)

    def _on_deadline(self) -> None:
        if not self._stream.finished:
            self.deadline_hit = True
            self._queue.engine.abort(self.request_id)

    def _close(self, usage: Usage | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        complete = usage is not None
        if usage is None:
            usage = Usage(prompt_tokens=self._ticket.prompt, completion_tokens=self._output)
        # Settle: what was delivered but not charged yet, and what the engine's usage counts beyond it.
        total = max(self._output, usage.completion_tokens)
        if total > self._charged:
            self._queue.charge_output(self._ticket, total - self._charged)
            self._charged = total
        self._queue.stream_ended(self._ticket, usage, complete)

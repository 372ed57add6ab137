"""How many of a stream's output tokens its client's socket took: what an unfinished stream is billed for.

A frame written to the transport is not delivered yet: the transport (asyncio's or uvloop's) keeps in
user space whatever the kernel would not take, and a client that stops reading leaves it there (the
stream is then paused by backpressure, inferd.api.streaming.sse). So each frame is remembered with the
byte offset where it ends and the stream's token count up to it, and the byte stream's tail still in user
space (`transport.get_write_buffer_size()`) says which frames have wholly left it: those tokens count.

The transport's buffer is dropped when the connection is lost, so the count is sampled while it is open:
after every write, when a paused stream drains, and on each watchdog scan. A client that leaves is billed
for the last sample, which is never more than its socket took (at most what moved in the kernel since,
an undercount in the client's favour). Pending frames are those still in the transport's buffer, which
the sender keeps near its high-water mark, so the memory is bounded.
"""
from __future__ import annotations

import collections
from asyncio import WriteTransport


class SocketAccepted:
    """Counts the tokens whose frames the kernel accepted into one stream's socket."""

    __slots__ = ("_transport", "_sent", "_taken", "_pending", "delivered_tokens")

    def __init__(self) -> None:
        self._transport: WriteTransport | None = None
        self._sent = 0                  # bytes this stream wrote to the transport
        self._taken = 0                 # output tokens read from the engine's stream so far
        self._pending: collections.deque[tuple[int, int]] = collections.deque()  # (frame's end offset, tokens)
        self.delivered_tokens = 0       # tokens in frames that left user space (the name settle reads)

    def attach(self, transport: WriteTransport) -> None:
        """From here the stream's bytes go to `transport` (bytes written before, headers, pings while it
        waited in admission, come ahead of them and are not counted)."""
        self._transport = transport

    def took(self, tokens: int) -> None:
        """`tokens` more output tokens were read; the next frame written carries them."""
        self._taken += tokens

    def wrote(self, nbytes: int) -> None:
        """A frame of `nbytes` was written to the transport."""
        self._sent += nbytes
        self._pending.append((self._sent, self._taken))
        self.sample()

    def sample(self) -> None:
        """Count the frames that have wholly left user space by now; nothing once the transport closes
        (its buffer may have been dropped, and would read as sent)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        out = self._sent - transport.get_write_buffer_size()
        pending = self._pending
        while pending and pending[0][0] <= out:
            self.delivered_tokens = pending.popleft()[1]

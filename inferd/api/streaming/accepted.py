"""How many of a stream's output tokens reached its client's machine: what an unfinished stream is billed for.

A frame written to the transport is not delivered yet. The transport (asyncio's or uvloop's) keeps in
user space whatever the kernel would not take, and the kernel's send queue keeps what the client has not
acknowledged: a client that stops reading leaves both full (the stream is then paused by backpressure,
inferd.api.streaming.sse), and Linux grows a socket's send buffer to megabytes. So each frame is
remembered with the byte offset where it ends and the stream's token count up to it; the bytes the
client's TCP acknowledged are those written less what waits in user space
(`transport.get_write_buffer_size()`) and in the send queue (`SIOCOUTQ`: written, not yet acknowledged).
Frames wholly acknowledged count. Over TLS, or where the send queue cannot be read, only user space is
subtracted (what the kernel accepted).

The count is sampled after a frame is written (one ioctl beside the frame's send(), about 1.8 us; at most
once per SAMPLE_INTERVAL_S, so an engine that outruns its clients does not pay it per frame), on each
watchdog scan and when a paused stream drains. Frames leave the pending list once acknowledged, so it
holds what the client has not acknowledged yet (which backpressure bounds) and the last interval's frames. The transport's buffer is dropped
when the connection is lost, so nothing is sampled after: a client that leaves is billed for the last
sample, never more than it received (what it acknowledged since then goes unbilled).
"""
from __future__ import annotations

import asyncio
import collections
import fcntl
import struct
import termios
import time
from asyncio import WriteTransport

_INT = b"\0\0\0\0"
SAMPLE_INTERVAL_S = 0.001
_monotonic = time.monotonic


class SocketAccepted:
    """Counts the tokens whose frames one stream's client acknowledged."""

    __slots__ = ("_fd", "_pending", "_sampled_at", "_sent", "_taken", "_transport", "delivered_tokens")

    def __init__(self) -> None:
        self._transport: WriteTransport | None = None
        self._fd = -1                   # the socket whose send queue is read (-1: none, or TLS)
        self._sent = 0                  # bytes this stream wrote to the transport
        self._taken = 0                 # output tokens read from the engine's stream so far
        self._pending: collections.deque[tuple[int, int]] = collections.deque()  # (frame's end offset, tokens)
        self._sampled_at = 0.0
        self.delivered_tokens = 0       # tokens in acknowledged frames (the name settle reads)

    def attach(self, transport: WriteTransport) -> None:
        """From here the stream's bytes go to `transport`. Bytes written before (headers, pings while it
        waited in admission) come ahead of them in the same queues, so they are never counted as ours."""
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self._fd = sock.fileno()

    def took(self, tokens: int) -> None:
        """`tokens` more output tokens were read; the next frame written carries them."""
        self._taken += tokens

    def wrote(self, nbytes: int) -> None:
        """A frame of `nbytes` was written to the transport."""
        self._sent += nbytes
        self._pending.append((self._sent, self._taken))
        if _monotonic() - self._sampled_at >= SAMPLE_INTERVAL_S:
            self.sample()

    def sample(self) -> None:
        """Count the frames the client has acknowledged by now; nothing once the transport closes (its
        buffer may have been dropped, and would read as sent)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._sampled_at = _monotonic()
        out = self._sent - transport.get_write_buffer_size() - self._unacknowledged()
        pending = self._pending
        while pending and pending[0][0] <= out:
            self.delivered_tokens = pending.popleft()[1]

    async def acknowledged(self, deadline: float) -> None:
        """Wait until the client has acknowledged every frame but the last (the stream's final frames,
        just written), so a stream is recorded as complete only once its content reached the client.
        A client reading along has acknowledged them already; one that stopped reading holds this until
        it reads, leaves (ConnectionResetError), or the request's `deadline` (time.monotonic) passes."""
        delay = 0.005
        while True:
            self.sample()
            if len(self._pending) <= 1:
                return
            transport = self._transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client closed the connection")
            left = deadline - _monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(delay, left))     # no event says "acknowledged": polled, backing off
            delay = min(delay * 2, 0.25)

    def _unacknowledged(self) -> int:
        if self._fd < 0:
            return 0
        try:
            return struct.unpack("i", fcntl.ioctl(self._fd, termios.TIOCOUTQ, _INT))[0]
        except OSError:                 # not a TCP socket after all (or closed): user space only
            self._fd = -1
            return 0

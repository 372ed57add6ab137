"""How many of a stream's output tokens reached its client's machine: what an unfinished stream is billed for.

A frame written to the transport is not delivered yet. The transport (asyncio's or uvloop's) keeps in
user space whatever the kernel would not take, and the kernel's send queue keeps what the client has not
acknowledged: a client that stops reading leaves both full (the stream is then paused by backpressure,
inferd.api.streaming.sse), and Linux grows a socket's send buffer to megabytes. So each frame is
remembered with the byte offset where it ends and the stream's token count up to it; the bytes the
client's TCP acknowledged are those written less what waits in user space
(`transport.get_write_buffer_size()`) and in the send queue (`SIOCOUTQ`: written, not yet acknowledged).
Frames wholly acknowledged count.

Over TLS the same is subtracted, counted in encrypted bytes: the TLS layer's buffers, the raw TCP
transport's (asyncio's, read through its TLS protocol; uvloop's cannot be read, docs/store.md states
that bound) and the send queue. An encrypted record is longer than the text it carries, so this never
counts a frame the client did not acknowledge; it may count the last few a record's overhead late.

On a plain TCP socket, Linux counts what the client acknowledged itself: TCP_INFO's `tcpi_bytes_acked`,
the connection's acknowledged bytes in all, which stays readable after a reset (the send queue does not). So
the stream's first byte's place in the connection is read once when its frames start (the acknowledged bytes,
plus what waits in the send queue and in user space); a sample is then one getsockopt, and none is needed
after each frame. It is sampled on each watchdog scan, when a paused stream drains, while the
stream's end waits for its acknowledgement, when the stream ends (before its row is recorded:
inferd.api.pipeline.respond), and once more when the connection is lost, before its socket
closes (its protocol's `on_lost`, inferd.daemon.listener.GuardedHandler), so a client that leaves, even with
a reset, is billed exactly what it acknowledged.
Where TCP_INFO has no such count (TLS, which counts encrypted bytes; a kernel before Linux 4.1; not TCP),
the send queue is read instead, after a frame is written (one ioctl beside the frame's send(), about 1.8 us;
at most once per SAMPLE_INTERVAL_S, so an engine that outruns its clients does not pay it per frame), and a
client that leaves is billed for the last sample, never more than it received: the transport's buffer, and a
reset connection's send queue, are dropped when the connection is lost.

Frames leave the pending list once acknowledged, so it holds what the client has not acknowledged yet and
the frames since the last sample; past MAX_PENDING entries, neighbours merge (a merged entry counts once its
later frame is acknowledged), so a slow client with megabytes queued costs a bounded list.
"""
from __future__ import annotations

import asyncio
import collections
import fcntl
import socket
import struct
import termios
import time
from asyncio import WriteTransport

_INT = b"\0\0\0\0"
SAMPLE_INTERVAL_S = 0.001
MAX_PENDING = 1024
# Polling the end's acknowledgement (no event says "acknowledged"): from 1 ms, doubling to at most 16 ms,
# so an acknowledgement is seen at most 16 ms late (a loopback or LAN client's within a millisecond or two),
# and a client that stopped reading costs about 60 wake-ups a second until the bound.
_POLL_FIRST_S, _POLL_MAX_S = 0.001, 0.016
_monotonic = time.monotonic
# struct tcp_info (linux/tcp.h): tcpi_bytes_acked is the u64 at byte 120 (Linux 4.1 and later; older kernels
# return a shorter struct).
_BYTES_ACKED_AT, _TCP_INFO_LEN = 120, 128


class SocketAccepted:
    """Counts the tokens whose frames one stream's client acknowledged."""

    __slots__ = ("_acked", "_base", "_fd", "_framed", "_last_start", "_pending", "_raw", "_sampled_at", "_sent",
                 "_sock", "_taken", "_transport", "delivered_tokens")

    def __init__(self) -> None:
        self._transport: WriteTransport | None = None
        self._raw: WriteTransport | None = None     # over TLS: the TCP transport under it, where readable
        self._fd = -1                   # the socket whose send queue is read (-1: none)
        self._sock: socket.socket | None = None   # the socket whose TCP_INFO is read (None: its send queue is)
        self._base = 0                  # with TCP_INFO: the connection's acknowledged bytes where this stream starts
        self._sent = 0                  # bytes this stream wrote to the transport
        self._last_start = 0            # where the last frame written begins
        self._acked = 0                 # bytes of this stream its client acknowledged, at the last sample
        self._taken = 0                 # output tokens read from the engine's stream so far
        self._framed = 0                # of those, the ones the frames written so far carry
        self._pending: collections.deque[tuple[int, int]] = collections.deque()  # (frame's end offset, tokens)
        self._sampled_at = 0.0
        self.delivered_tokens = 0       # tokens in acknowledged frames (the name settle reads)

    def attach(self, transport: WriteTransport) -> None:
        """From here the stream's bytes go to `transport`. Bytes written before (headers, pings while it
        waited in admission) come ahead of them in the same queues, so they are never counted as ours."""
        self._transport = transport
        self._raw = _tls_raw_transport(transport)
        sock = transport.get_extra_info("socket")
        if sock is None:
            return
        self._fd = sock.fileno()
        if self._raw is None and transport.get_extra_info("sslcontext") is None:
            # The send queue first: an acknowledgement between the two reads can only raise the base, so a
            # frame is never counted before its client acknowledged it.
            held = transport.get_write_buffer_size() + self._unacknowledged()
            acked = _bytes_acked(sock)
            if acked is not None:
                self._sock, self._base = sock, acked + held
                # A protocol with `on_lost` calls it when the connection is lost, before the transport closes
                # the socket: a client that leaves is read one last time.
                protocol = transport.get_protocol() if hasattr(transport, "get_protocol") else None
                if hasattr(protocol, "on_lost"):
                    protocol.on_lost = self.sample

    def took(self, tokens: int) -> None:
        """`tokens` more output tokens were read; the next frame written carries them."""
        self._taken += tokens

    @property
    def taken(self) -> int:
        """Output tokens read so far."""
        return self._taken

    def took_until(self, total: int) -> None:
        """`total` output tokens were read in all (a writer process hears the count with the main process's frames)."""
        if total > self._taken:
            self._taken = total

    def counted_elsewhere(self, tokens: int) -> None:
        """A writer process, which writes this stream's frames, counted `tokens` acknowledged
        (inferd.api.streaming.writers): the stream's count, as this process never writes its socket."""
        if tokens > self.delivered_tokens:
            self.delivered_tokens = tokens

    def wrote(self, nbytes: int, content: bool = True) -> None:
        """A frame of `nbytes` was written to the transport: one carrying the tokens read so far, or (not
        `content`: a keep-alive ping) none, so that tokens whose text an encoder still holds back are not
        counted once the ping is acknowledged."""
        self._last_start = self._sent
        self._sent += nbytes
        if content:
            self._framed = self._taken
        pending = self._pending
        pending.append((self._sent, self._framed))
        if len(pending) > MAX_PENDING:
            self._pending = _merged(pending)
        if self._sock is None and _monotonic() - self._sampled_at >= SAMPLE_INTERVAL_S:
            self.sample()

    def sample(self) -> None:
        """Count the frames the client has acknowledged by now. With TCP_INFO, until the socket closes (a
        reset connection still tells); without, until the transport closes (its buffer may have been
        dropped, and would read as sent)."""
        if not self._pending:           # every frame written is counted (or none was: a handed-over stream's)
            return
        if self._sock is not None:
            acked = _bytes_acked(self._sock)
            if acked is None:
                return
            out = acked - self._base
        else:
            transport = self._transport
            if transport is None or transport.is_closing():
                return
            self._sampled_at = _monotonic()
            held = transport.get_write_buffer_size()
            if self._raw is not None:
                held += self._raw.get_write_buffer_size()
            out = self._sent - held - self._unacknowledged()
        if out > self._acked:
            self._acked = out
        pending = self._pending
        while pending and pending[0][0] <= out:
            # Never lower: a writer process's count (counted_elsewhere) may be ahead of frames written here.
            self.delivered_tokens = max(self.delivered_tokens, pending.popleft()[1])

    async def acknowledged(self, bound_s: float) -> bool:
        """Wait until the client has acknowledged every byte written before the last frame (the stream's
        final frames, just written), so a stream is recorded as complete only once its content reached the
        client. A client reading along has acknowledged them already, or does within its round trip.
        False: `bound_s` passed first (a client that stopped reading; what it acknowledged is counted);
        ConnectionResetError: the client left."""
        target, give_up, delay = self._last_start, _monotonic() + bound_s, _POLL_FIRST_S
        while True:
            self.sample()
            if self._acked >= target:
                return True
            transport = self._transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client closed the connection")
            left = give_up - _monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX_S)

    def _unacknowledged(self) -> int:
        if self._fd < 0:
            return 0
        try:
            return struct.unpack("i", fcntl.ioctl(self._fd, termios.TIOCOUTQ, _INT))[0]
        except OSError:                 # not a TCP socket after all (or closed): user space only
            self._fd = -1
            return 0


def _bytes_acked(sock: socket.socket) -> int | None:
    """The connection's bytes its peer acknowledged, in all (TCP_INFO); None where the kernel does not count
    them, or the socket is closed."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except (OSError, ValueError):   # closed (uvloop's socket then has no descriptor), or not TCP
        return None
    if len(info) < _TCP_INFO_LEN:
        return None
    return struct.unpack_from("Q", info, _BYTES_ACKED_AT)[0]


def _merged(pending: collections.deque[tuple[int, int]]) -> collections.deque[tuple[int, int]]:
    """Every other entry, the newest kept: each stands for its frame and the one before it."""
    return collections.deque(list(pending)[::-1][::2][::-1])


def _tls_raw_transport(transport: WriteTransport) -> WriteTransport | None:
    """The TCP transport under asyncio's TLS transport, whose buffer `get_write_buffer_size()` leaves out
    (None for plain TCP, and for uvloop's TLS, whose protocol does not expose it)."""
    raw = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
    return raw if callable(getattr(raw, "get_write_buffer_size", None)) else None

"""One client socket in an SSE writer process (inferd.api.streaming.writer_proc): its frames, encoded there,
written as the socket takes them, what its client acknowledged of them (SocketAccepted, reading this
object as its transport), and the times the main process's metrics need of them (FrameHistogram)."""
from __future__ import annotations

import bisect
import socket

from inferd.api.streaming.accepted import SocketAccepted
from inferd.api.wire.responses import ChunkEncoder
from inferd.observability import ITL_BUCKETS, WRITE_DELAY_BUCKETS

# What one stream may hold encoded and unsent before its client counts as gone (every byte past the
# first BLOCKED was sent before the main process heard of it: about one step's text).
MAX_UNSENT = 8 << 20
# The main process's histograms' bounds, +Inf last: inferd_stream_write_delay_seconds, inferd_inter_token_latency_seconds.
WRITE_DELAY_BOUNDS = (*WRITE_DELAY_BUCKETS, float("inf"))
ITL_BOUNDS = (*ITL_BUCKETS, float("inf"))


class ClientStream:
    """One handed-over client socket: encodes and writes its frames, merging text while it is behind."""

    __slots__ = ("accepted", "blocked", "chunked", "closing", "delays", "encoder", "fd", "gone", "itls", "last_frame",
                 "pushed_at", "reported", "sid", "sock", "text", "tokens", "unsent", "unseen")

    def __init__(self, sid: int, sock: socket.socket, chunked: bool, encoder: ChunkEncoder, delays: SeriesBins,
                 itls: SeriesBins) -> None:
        self.sid = sid
        self.sock = sock
        self.fd = sock.fileno()
        self.chunked = chunked
        self.encoder = encoder
        self.unsent = bytearray()       # encoded, not yet taken by the socket
        self.text: list[str] = []       # text not yet encoded (merges while unsent is non-empty)
        self.tokens = 0                 # the tokens that text carries
        self.closing = False
        self.blocked = False
        self.gone = False
        self.accepted = SocketAccepted()  # this stream's bytes, against its socket's send queue
        self.accepted.attach(self)        # type: ignore[arg-type]  (this object is its transport)
        self.reported = 0                 # acknowledged tokens the main process was told of
        self.delays = delays              # its metric series' write delays and ITLs (the main process's labels)
        self.itls = itls
        self.pushed_at: float | None = None   # when the engine pushed the oldest text not yet taken by the socket
        self.unseen = 0                   # tokens in frames the socket has not wholly taken yet (for their ITL)
        self.last_frame: float | None = None  # when the socket took the previous frames with tokens (None: none yet)

    # What SocketAccepted reads of a transport: the socket, and what waits in user space.
    def get_extra_info(self, name: str) -> socket.socket | None:
        return self.sock if name == "socket" else None

    def get_write_buffer_size(self) -> int:
        return len(self.unsent)

    def is_closing(self) -> bool:
        return self.gone

    def frame(self, data: bytes, tokens: int = 0) -> None:
        self.accepted.took(tokens)
        self.unseen += tokens
        if data:
            framed = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data
            self.unsent += framed
            self.accepted.wrote(len(framed))

    def settle(self) -> None:
        """Encode the pending text as one frame (with the usage so far, for continuous usage stats)."""
        text, tokens, encoder = "".join(self.text), self.tokens, self.encoder
        self.text.clear()
        self.tokens = 0
        if text:
            self.frame(encoder.content(text) if encoder.running is None else encoder.content_with_usage(text, tokens),
                       tokens)
        else:
            self.accepted.took(tokens)      # they ride on the next frame (no latency of their own, as in process)
            if tokens and encoder.running is not None:
                encoder.running.count(tokens)

    def pump(self) -> bool:
        """Write what the socket takes; True when everything (text included) is out."""
        while True:
            if not self.unsent and (self.text or self.tokens):
                self.settle()
            if not self.unsent:
                return True
            sent = self.sock.send(self.unsent)      # ConnectionError / BlockingIOError: the caller's
            del self.unsent[:sent]
            if self.unsent:
                return False

    def inter_token_latency(self, now: float) -> float | None:
        """Everything written was just taken by the socket (`now`): the inter-token latency its tokens observe, as
        the in-process writer observes one per frame (inferd.observability.RequestObservation.on_tokens): the
        time since the socket took the previous tokens' frames, over these tokens. None: no tokens, or the
        first frames this process wrote (the main process observed those tokens' latency, TTFT, handing them
        over)."""
        tokens = self.unseen
        if not tokens:
            return None
        self.unseen = 0
        last, self.last_frame = self.last_frame, now
        return None if last is None else (now - last) / tokens


class SeriesBins:
    """One metric series' observations of one histogram since they were last taken: counts per bucket, and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1    # the first bucket with seconds <= bound
        self.total += seconds


class FrameHistogram:
    """Observations of one of the main process's histograms made here since they were last taken, per metric series
    of the main process: counts per bucket of its `bounds` (+Inf last) and their sum. A stream keeps its series' bins
    (`bins`), so an observation per frame is a bisect and two adds."""

    __slots__ = ("bounds", "_by_series")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._by_series: dict[int, SeriesBins] = {}

    def bins(self, series: int) -> SeriesBins:
        got = self._by_series.get(series)
        if got is None:
            got = self._by_series[series] = SeriesBins(self.bounds)
        return got

    def take(self) -> list[list]:
        """[[series, counts, sum], ...] of the series observed since the last take."""
        out = []
        for series, bins in self._by_series.items():
            if any(bins.counts):
                out.append([series, bins.counts, bins.total])
                bins.counts, bins.total = [0] * len(self.bounds), 0.0
        return out

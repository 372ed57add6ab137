"""An SSE writer process: writes the frames of the streams the main process handed it.

Run as `python -m inferd.api.streaming.writer_proc FD`, FD its end of a SOCK_SEQPACKET pair
(inferd.api.streaming.writer_wire). Each stream arrives as a client socket (SCM_RIGHTS) whose response
headers the main process already wrote; from then on only this process writes to it. Text arrives once
per engine step, batched across streams; it is encoded here (the same ChunkEncoder) as one frame per
stream per read of the channel (READ_BATCH messages): one step's text while this process keeps up,
several steps' once it is behind, so it catches up. A client that is behind gets its text merged into one
frame once its socket takes more, and is reported (BLOCKED) so the main process stops sending its text
(it merges in the engine's RequestStream, as in-process), and reported again once drained; one that left
is reported (GONE).
The main process's RAW frames are written as they are. CLOSE: once all is written the socket is handed
back: this process closes its copy and says RETURNED, and the main process ends the body and reads the
client's next request (or closes the connection, as HTTP says). A client's bytes are only ever peeked at
here, never read: a request sent early stays for the main process.

What each client acknowledged is counted here, with the in-process accounting (SocketAccepted: frames
written, with the tokens they carry, against what the connection acknowledged), and reported with GONE, in
answer to ACK (before the stream's end) and a few times a second (TOOK). Reports wait in a queue while the main
process's socket is full. On end-of-file from the main process, what is queued is written out (for at
most EOF_GRACE_S) before the connections close.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import sys
import time

from inferd.api.streaming import writer_wire as wire
from inferd.api.streaming.writer_client import ITL_BOUNDS, MAX_UNSENT, WRITE_DELAY_BOUNDS, ClientStream, FrameHistogram
from inferd.api.wire.responses import ChunkEncoder, Identity, RunningUsage
from inferd.observability import tune_collector

# Messages read before the streams they gave text are written: a writer behind by several steps writes
# each stream's as one frame (one send(), not one per step), so the further behind, the less a token costs;
# the bound lets the clients' sockets and the samples have their turns.
READ_BATCH = 64
# Reports waiting for the main process's socket: a few per stream at most; past this many it has stopped
# reading altogether, and this process ends (the main process then ends every stream it had as a disconnect).
MAX_REPORTS = 1 << 16
# How often what the clients acknowledged is sampled and reported (TOOK), as the in-process watchdog does.
SAMPLE_EVERY_S = 0.25
TOOK_BATCH = 4096
# On end-of-file from the main process: how long what is queued for the clients may take to go out.
EOF_GRACE_S = 2.0
# After CLOSE, how long a stream's last bytes may wait for its client to take them before the connection is
# dropped (the main process sends [server] stream_ack_timeout_s with CLOSE; this when it sends none): it no
# longer counts the connection, so a client that stopped reading must not keep it, and its buffer, here.
CLOSE_GRACE_S = 10.0


class Writer:
    """The writer's loop: the channel from the main process, and the client sockets."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.loop = asyncio.get_running_loop()
        self.streams: dict[int, ClientStream] = {}
        self.closed = asyncio.Event()
        self.reports: collections.deque[bytes] = collections.deque()   # waiting for the channel to take them
        self.tasks: set[asyncio.Task] = set()
        self.delays = FrameHistogram(WRITE_DELAY_BOUNDS)      # from the engine's push to the socket
        self.itls = FrameHistogram(ITL_BOUNDS)                  # between a stream's frames, taken by its socket
        self.dirty: dict[int, ClientStream] = {}      # streams given text by this read, by sid

    def start(self) -> None:
        self.channel.setblocking(False)
        self.loop.add_reader(self.channel.fileno(), self._read)
        self._spawn(self._sample_loop())
        self._report([wire.READY])

    def _spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _report(self, message: list) -> None:
        if self._deaf or self.closed.is_set():
            return
        if len(self.reports) >= MAX_REPORTS:
            print("inferd-writer: the main process stopped reading reports; exiting", file=sys.stderr)
            self._main_gone()
            return
        self.reports.append(wire.encode(message))
        if len(self.reports) == 1:
            self._send_reports()

    def _send_reports(self) -> None:
        reports = self.reports
        while reports:
            try:
                self.channel.send(reports[0])
            except BlockingIOError:
                if not self._waiting_to_report:
                    self.loop.add_writer(self.channel.fileno(), self._send_reports)
                    self._waiting_to_report = True
                return
            except OSError:             # the main process is gone: what it sent is still read, to its end
                self._deaf = True
                reports.clear()
                break
            reports.popleft()
        if self._waiting_to_report:
            self._waiting_to_report = False
            self.loop.remove_writer(self.channel.fileno())

    _waiting_to_report = False
    _deaf = False                   # the main process no longer reads reports

    def _main_gone(self) -> None:
        self.reports.clear()
        if self._waiting_to_report:
            self._waiting_to_report = False
            self.loop.remove_writer(self.channel.fileno())
        self.loop.remove_reader(self.channel.fileno())
        self.closed.set()

    def _read(self) -> None:
        try:
            for _ in range(READ_BATCH):
                if self.closed.is_set():
                    return
                try:
                    data, fds, _, _ = socket.recv_fds(self.channel, wire.MAX_MESSAGE, 1)
                except BlockingIOError:
                    return
                except OSError:
                    data, fds = b"", []
                if not data:
                    self._main_gone()
                    return
                self._handle(wire.decode(data), fds)
        finally:
            self._pump_dirty()

    def _pump_dirty(self) -> None:
        dirty = self.dirty
        if dirty:
            self.dirty = {}
            for stream in dirty.values():
                self._pump(stream)

    def _handle(self, msg: list, fds: list[int]) -> None:
        kind = msg[0]
        if kind == wire.STEP:
            for sid, text, tokens, pushed_at in msg[1]:
                stream = self.streams.get(sid)
                if stream is not None:
                    stream.text.append(text)
                    stream.tokens += tokens
                    if stream.pushed_at is None:
                        stream.pushed_at = pushed_at
                    self.dirty[sid] = stream
        elif kind == wire.OPEN:
            self._open(msg, fds[0])
        else:
            stream = self.streams.get(msg[1])
            if stream is None:
                if kind == wire.ACK:        # it left already (GONE is on its way): nothing acknowledged more
                    self._report([wire.ACKED, msg[1], 0, False])
                return
            stream.settle()             # the text before it goes first
            if kind == wire.RAW:
                taken = stream.accepted.taken
                stream.accepted.took_until(msg[3])      # what the main process read in all: the final delta's too
                stream.unseen += stream.accepted.taken - taken       # tokens this frame carries (the final chunk's)
                stream.frame(msg[2].encode())
                self._pump(stream)
            elif kind == wire.ACK:
                self._spawn(self._acknowledge(stream, msg[2]))
            elif kind == wire.CLOSE:
                stream.closing = True
                self._pump(stream)
                if not stream.gone:
                    self.loop.call_later(msg[2] if len(msg) > 2 and msg[2] is not None else CLOSE_GRACE_S, self._drop,
                                        stream)
            elif kind == wire.ABORT:
                self._drop(stream)

    async def _acknowledge(self, stream: ClientStream, bound_s: float) -> None:
        try:
            ok = await stream.accepted.acknowledged(bound_s)
        except ConnectionResetError:    # it left meanwhile (GONE reported, or the main process aborted it)
            ok = False
        stream.reported = stream.accepted.delivered_tokens
        self._report([wire.ACKED, stream.sid, stream.reported, ok])

    async def _sample_loop(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            took = []
            for stream in self.streams.values():
                stream.accepted.sample()
                if stream.accepted.delivered_tokens != stream.reported:
                    stream.reported = stream.accepted.delivered_tokens
                    took.append([stream.sid, stream.reported])
            for at in range(0, len(took), TOOK_BATCH):
                self._report([wire.TOOK, took[at:at + TOOK_BATCH]])
            delays, itls = self.delays.take(), self.itls.take()
            if delays or itls:
                self._report([wire.DELAYS, delays, itls])

    def _open(self, msg: list, fd: int) -> None:
        _, sid, chunked, kind, ident, created, model, fingerprint, include_usage, prompt_tokens, series = msg
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        running = RunningUsage(prompt_tokens) if prompt_tokens is not None else None
        encoder = ChunkEncoder(Identity(kind, ident, created, model, fingerprint), include_usage, running=running)
        stream = self.streams[sid] = ClientStream(sid, sock, chunked, encoder, self.delays.bins(series),
                                                  self.itls.bins(series))
        self.loop.add_reader(fd, self._client_readable, stream)

    def _client_readable(self, stream: ClientStream) -> None:
        try:
            data = stream.sock.recv(1, socket.MSG_PEEK)     # peeked: bytes the client sent are the main process's
        except BlockingIOError:
            return
        except OSError:                 # reset
            self._gone(stream)
            return
        if data:                        # its next request, sent early: left unread; a failed send still notices a reset
            self.loop.remove_reader(stream.fd)
            return
        self._gone(stream)              # it closed its end (FIN)

    def _pump(self, stream: ClientStream) -> None:
        if stream.gone:
            return
        try:
            done = stream.pump()
        except BlockingIOError:
            done = False
        except OSError:
            self._gone(stream)
            return
        if stream.blocked:
            stream.accepted.sample()    # the socket took more: what the client acknowledged meanwhile
        if done:                        # the socket took every frame: their tokens' latencies
            now = time.monotonic()
            if stream.pushed_at is not None:        # the text's frame: its oldest token's delay from the engine
                stream.delays.observe(now - stream.pushed_at)
                stream.pushed_at = None
            itl = stream.inter_token_latency(now)
            if itl is not None:
                stream.itls.observe(itl)
            if stream.blocked:
                stream.blocked = False
                self.loop.remove_writer(stream.fd)
                self._report([wire.DRAINED, stream.sid, 0])
            if stream.closing:
                self._drop(stream, returned=True)
        elif not stream.blocked:
            stream.blocked = True
            self.loop.add_writer(stream.fd, self._pump, stream)
            self._report([wire.BLOCKED, stream.sid, 0])
        elif len(stream.unsent) > MAX_UNSENT:
            self._gone(stream)

    def _gone(self, stream: ClientStream) -> None:
        # What it acknowledged is read once more while the socket is open (else a client that leaves between
        # two samples is billed as of the one before): after a FIN the send queue is intact, and TCP_INFO's
        # count survives a reset too (inferd.api.streaming.accepted).
        stream.accepted.sample()
        closing = stream.closing
        self._drop(stream)
        if not closing:                 # billed what it acknowledged
            self._report([wire.GONE, stream.sid, stream.accepted.delivered_tokens])

    def _drop(self, stream: ClientStream, *, returned: bool = False) -> None:
        """Stop writing `stream` and close this process's copy of its socket (the connection ends with the last
        copy: the main process's, which aborts it unless `returned`). A CLOSE is answered either way."""
        if self.streams.pop(stream.sid, None) is None:
            return
        stream.gone = True
        self.loop.remove_reader(stream.fd)
        self.loop.remove_writer(stream.fd)
        stream.sock.close()
        if stream.closing:
            self._report([wire.RETURNED, stream.sid, stream.accepted.delivered_tokens, returned])

    async def finish(self, grace_s: float) -> None:
        """The main process is gone: let what is queued for the clients go out (for at most `grace_s`),
        then close every connection."""
        give_up = time.monotonic() + grace_s
        while any(s.unsent or s.text for s in self.streams.values()) and time.monotonic() < give_up:
            await asyncio.sleep(0.01)   # the clients' sockets are written from their writer callbacks
        for stream in list(self.streams.values()):
            self._drop(stream)
        for task in list(self.tasks):
            task.cancel()


async def serve(fd: int) -> None:
    channel = socket.socket(fileno=fd)
    tune_collector()                # fewer collections (inferd.observability.garbage)
    writer = Writer(channel)
    writer.start()
    await writer.closed.wait()
    await writer.finish(EOF_GRACE_S)


def name_process() -> None:
    """`inferd-writer` in ps/top (and for bench/process_cpu.py's per-role CPU), where Linux allows it."""
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as comm:
            comm.write("inferd-writer")


def main() -> None:
    name_process()
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:             # pragma: no cover
        runner = asyncio.run
    runner(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()

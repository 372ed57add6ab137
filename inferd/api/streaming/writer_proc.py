"""An SSE writer process: writes the frames of the streams the main process handed it.

Run as `python -m inferd.api.streaming.writer_proc FD`, FD its end of a SOCK_SEQPACKET pair
(inferd.api.streaming.writer_wire). Each stream arrives as a client socket (SCM_RIGHTS) whose response
headers the main process already wrote; from then on only this process writes to it. Text arrives once
per engine step, batched across streams; it is encoded here (the same ChunkEncoder) as one frame per
stream per step, or, when a client is behind, merged into one frame once its socket takes more. A client
that is behind is reported (BLOCKED) so the main process stops sending its text (it merges in the
engine's RequestStream, as in-process), and reported again once drained; one that left is reported (GONE).
The main process's RAW frames are written as they are. CLOSE: once all is written, the chunked body's
end, and the connection is closed (the response said `Connection: close`).
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import sys

from inferd.api.streaming import writer_wire as wire
from inferd.api.wire.responses import ChunkEncoder, Identity, RunningUsage

# What one stream may hold encoded and unsent before its client counts as gone (every byte past the
# first BLOCKED was sent before the main process heard of it: about one step's text).
MAX_UNSENT = 8 << 20


class ClientStream:
    """One handed-over client socket: encodes and writes its frames, merging text while it is behind."""

    __slots__ = ("blocked", "chunked", "closing", "encoder", "fd", "gone", "sid", "sock", "text", "tokens", "unsent")

    def __init__(self, sid: int, sock: socket.socket, chunked: bool, encoder: ChunkEncoder) -> None:
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

    def frame(self, data: bytes) -> None:
        if data:
            self.unsent += b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data

    def settle(self) -> None:
        """Encode the pending text as one frame (with the usage so far, for continuous usage stats)."""
        text, tokens, encoder = "".join(self.text), self.tokens, self.encoder
        self.text.clear()
        self.tokens = 0
        if text:
            self.frame(encoder.content(text) if encoder.running is None else encoder.content_with_usage(text, tokens))
        elif tokens and encoder.running is not None:
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


class Writer:
    """The writer's loop: the channel from the main process, and the client sockets."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.loop = asyncio.get_running_loop()
        self.streams: dict[int, ClientStream] = {}
        self.closed = asyncio.Event()

    def start(self) -> None:
        self.channel.setblocking(False)
        self.loop.add_reader(self.channel.fileno(), self._read)

    def _report(self, kind: str, sid: int) -> None:
        with contextlib.suppress(BlockingIOError):      # the main process is not reading: it is stopping
            self.channel.send(wire.encode([kind, sid]))

    def _read(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.channel, wire.MAX_MESSAGE, 1)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self.loop.remove_reader(self.channel.fileno())
                self.closed.set()
                return
            self._handle(wire.decode(data), fds)

    def _handle(self, msg: list, fds: list[int]) -> None:
        kind = msg[0]
        if kind == wire.STEP:
            for sid, text, tokens in msg[1]:
                stream = self.streams.get(sid)
                if stream is not None:
                    stream.text.append(text)
                    stream.tokens += tokens
                    self._pump(stream)
        elif kind == wire.OPEN:
            self._open(msg, fds[0])
        else:
            stream = self.streams.get(msg[1])
            if stream is None:
                return
            stream.settle()             # the text before it goes first
            if kind == wire.RAW:
                stream.frame(msg[2].encode())
                self._pump(stream)
            elif kind == wire.CLOSE:
                stream.closing = True
                if stream.chunked:
                    stream.unsent += b"0\r\n\r\n"
                self._pump(stream)
            elif kind == wire.ABORT:
                self._drop(stream)

    def _open(self, msg: list, fd: int) -> None:
        _, sid, chunked, kind, ident, created, model, fingerprint, include_usage, prompt_tokens = msg
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        running = RunningUsage(prompt_tokens) if prompt_tokens is not None else None
        encoder = ChunkEncoder(Identity(kind, ident, created, model, fingerprint), include_usage, running=running)
        stream = self.streams[sid] = ClientStream(sid, sock, chunked, encoder)
        self.loop.add_reader(fd, self._client_readable, stream)

    def _client_readable(self, stream: ClientStream) -> None:
        try:
            data = stream.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:                    # the client closed its end: it left
            self._gone(stream)

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
        if done:
            if stream.blocked:
                stream.blocked = False
                self.loop.remove_writer(stream.fd)
                self._report(wire.DRAINED, stream.sid)
            if stream.closing:
                self._drop(stream)
        elif not stream.blocked:
            stream.blocked = True
            self.loop.add_writer(stream.fd, self._pump, stream)
            self._report(wire.BLOCKED, stream.sid)
        elif len(stream.unsent) > MAX_UNSENT:
            self._gone(stream)

    def _gone(self, stream: ClientStream) -> None:
        closing = stream.closing
        self._drop(stream)
        if not closing:
            self._report(wire.GONE, stream.sid)

    def _drop(self, stream: ClientStream) -> None:
        if self.streams.pop(stream.sid, None) is None:
            return
        stream.gone = True
        self.loop.remove_reader(stream.fd)
        self.loop.remove_writer(stream.fd)
        stream.sock.close()


async def serve(fd: int) -> None:
    channel = socket.socket(fileno=fd)
    writer = Writer(channel)
    writer.start()
    await writer.closed.wait()
    for stream in list(writer.streams.values()):
        writer._drop(stream)


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

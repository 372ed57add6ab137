"""SSE writer processes, the main process's side: hand a stream's client socket over, then its text.

With `[server] front_processes = N` (N > 0) the app starts N writer processes
(inferd.api.streaming.writer_proc). A plain-TCP chat or text completion stream whose headers this process
writes is handed to one of them once the headers are out: its socket goes over with SCM_RIGHTS and this
process keeps everything else (the engine's RequestStream, admission, quotas, the ledger, the watchdog).
Once per loop turn (an engine step's outputs arrive in one) every writer gets one STEP message with each
of its streams' new text; the stream's final frames, pings and `[DONE]` (after the ledger row) are encoded
here and sent as RAW. Writers report clients that left (GONE: the stream ends as a disconnect does in
process, and its engine request is aborted) and clients behind (BLOCKED/DRAINED: their text merges in the
RequestStream meanwhile). Once the stream is written the writer hands the socket back (RETURNED): this
process ends the response and the connection serves the client's next request here; TLS streams stay in
process.
Billing reads what the writer counted (its reports carry the tokens each client acknowledged). A writer
that dies ends its streams as disconnects (their engine requests aborted) and is replaced after a backoff
(WriterPool.lost, inferd.api.streaming.writer_pool); while none is alive, new streams are written in process.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
from pathlib import Path
from typing import Protocol

import inferd
from inferd.observability import get_logger
from inferd.api.streaming import writer_wire as wire

log = get_logger("inferd.api.streaming.writers")
# Messages, and their bytes, queued for a writer whose socket is full; past either the writer is treated as dead.
# 4096 messages are about 16 turns of a busy writer's traffic; 64 MiB bounds what one slow writer holds here
# (a message is at most SPLIT_AT, and RAW pieces are TEXT_PIECE characters).
MAX_QUEUED, MAX_QUEUED_BYTES = 4096, 64 << 20


def child_env() -> dict[str, str]:
    """This environment, with the directory this process's `inferd` came from first on the path."""
    root = str(Path(inferd.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class Reported(Protocol):
    """What a handed-over stream's sender is to its writer link: told what the writer reports."""

    def on_report(self, msg: list) -> None: ...


class FrameTimesSink(Protocol):
    """A stream's metric series, as far as what writers observe of frames goes (inferd.observability.ModelSeries)."""

    def add_write_delays(self, counts: list[int], total: float) -> None: ...
    def add_itls(self, counts: list[int], total: float) -> None: ...


class LinkOwner(Protocol):
    """What a writer link tells the pool that started it (inferd.api.streaming.writer_pool.WriterPool)."""

    def schedule(self, link: WriterLink) -> None: ...
    def add_frame_times(self, delays: list, itls: list) -> None: ...
    def lost(self, link: WriterLink) -> None: ...


class WriterDown(ConnectionError):
    """A writer process is gone, or so far behind that its queue is full: its streams end as disconnects."""


class WriterLink:
    """One writer process: its socket, the STEP being gathered this turn, and what waits to be sent."""

    def __init__(self, pool: LinkOwner, sock: socket.socket, process: asyncio.subprocess.Process) -> None:
        self.pool = pool
        self.sock = sock
        self.process = process
        self.senders: dict[int, Reported] = {}   # each handed-over stream, by sid
        self.step: list[list] = []
        self.step_bytes = 0
        self.queued: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        self.queued_bytes = 0
        self.down = False
        self.started = asyncio.get_running_loop().time()
        self.ready = asyncio.get_running_loop().create_future()   # set by its READY

    def send(self, message: list, fds: list[int] | None = None) -> None:
        if self.step:
            self._flush_step()
        self._send(wire.encode(message), fds or [])

    def add_text(self, sid: int, text: str, tokens: int, pushed_at: float | None = None) -> None:
        step = self.step
        if not step:
            self.pool.schedule(self)
        size = len(text)
        if size <= wire.TEXT_PIECE and self.step_bytes + 4 * size + 48 <= wire.SPLIT_AT:
            step.append([sid, text, tokens, pushed_at])    # the usual: a few tokens' text into this turn's STEP
            self.step_bytes += 4 * size + 48
            return
        *head, last = wire.text_pieces(text)   # a long merged delta: pieces, its tokens on the last
        for piece in head:
            self._add(sid, piece, 0, pushed_at)
        self._add(sid, last, tokens, pushed_at)

    def _add(self, sid: int, text: str, tokens: int, pushed_at: float | None) -> None:
        self.step.append([sid, text, tokens, pushed_at])
        self.step_bytes += 4 * len(text) + 48      # JSON of the worst case (escapes)
        if self.step_bytes > wire.SPLIT_AT:
            self._flush_step()

    def _flush_step(self) -> None:
        step, self.step, self.step_bytes = self.step, [], 0
        if step:
            self._send(wire.encode([wire.STEP, step]), [])

    def _send(self, data: bytes, fds: list[int]) -> None:
        if self.down:
            raise WriterDown("the writer process is gone")
        if not self.queued:
            try:
                socket.send_fds(self.sock, [data], fds) if fds else self.sock.send(data)
                return
            except BlockingIOError:
                asyncio.get_running_loop().add_writer(self.sock.fileno(), self._drain)
            except OSError as exc:
                self._lost()
                raise WriterDown("the writer process is gone") from exc
        if len(self.queued) >= MAX_QUEUED or self.queued_bytes + len(data) > MAX_QUEUED_BYTES:
            self._lost()
            raise WriterDown("the writer process is not keeping up")
        # A queued socket goes as its own duplicate: the stream may end (and its fd be closed and reused
        # for another connection) before the queue drains.
        self.queued.append((data, [os.dup(fd) for fd in fds]))
        self.queued_bytes += len(data)

    def discard_queued(self) -> None:
        """Drop what waits to be sent, closing the duplicated sockets it holds."""
        for _, fds in self.queued:
            for fd in fds:
                os.close(fd)
        self.queued.clear()
        self.queued_bytes = 0

    def _drain(self) -> None:
        while self.queued:
            data, fds = self.queued[0]
            try:
                socket.send_fds(self.sock, [data], fds) if fds else self.sock.send(data)
            except BlockingIOError:
                return
            except OSError:
                self._lost()
                return
            self.queued.popleft()
            self.queued_bytes -= len(data)
            for fd in fds:
                os.close(fd)
        asyncio.get_running_loop().remove_writer(self.sock.fileno())

    def read(self) -> None:
        while True:
            try:
                data = self.sock.recv(wire.MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            msg = wire.decode(data)
            if msg[0] == wire.READY:
                if not self.ready.done():
                    self.ready.set_result(None)
                continue
            if msg[0] == wire.DELAYS:
                self.pool.add_frame_times(msg[1], msg[2])
                continue
            if msg[0] == wire.TOOK:
                senders = self.senders
                for sid, tokens in msg[1]:
                    sender = senders.get(sid)
                    if sender is not None:
                        sender.on_report([wire.TOOK, sid, tokens])
                continue
            sender = self.senders.get(msg[1])
            if sender is not None:
                sender.on_report(msg)

    def _lost(self) -> None:
        if self.down:
            return
        self.down = True
        if not self.ready.done():           # nothing to wait for any more
            self.ready.set_result(None)
        log.error("writer_process_lost", pid=self.process.pid)
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.sock.fileno())
        loop.remove_writer(self.sock.fileno())
        self.discard_queued()
        for sid, sender in list(self.senders.items()):
            sender.on_report([wire.GONE, sid, None])    # billed what the writer last reported
        self.senders.clear()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()         # one not keeping up is alive: it would write to clients no longer its own
        self.pool.lost(self)

"""A handed-over stream's sender in the main process: its text goes to a writer process
(inferd.api.streaming.writers) once per loop turn, its final frames, pings and `[DONE]` as RAW."""
from __future__ import annotations

import contextlib
import time

from aiohttp.abc import AbstractStreamWriter

from inferd.admission.stream import AdmittedStream

from inferd.api.streaming import writer_wire as wire
from inferd.api.streaming.sse import Sender, Tracked, final_frames
from inferd.api.streaming.writers import WriterDown, WriterPool
from inferd.api.wire.responses import ChunkEncoder
from inferd.observability import RequestObservation
from inferd.types import Delta

_monotonic = time.monotonic


class HandoffSender(Sender):
    """A stream whose frames a writer process writes: its text goes out in the writer's STEP, the
    rest (final frames, pings, `[DONE]`) as RAW; this process's own copy of the socket is not written to."""

    __slots__ = ("link", "paused", "sid", "started")

    def __init__(self, entry: Tracked, writer: AbstractStreamWriter, encoder: ChunkEncoder, include_usage: bool,
                 obs: RequestObservation, *, pool: WriterPool) -> None:
        super().__init__(entry, writer, encoder, include_usage, obs)
        link = pool.pick()
        sock = self._transport.get_extra_info("socket")
        if link is None or sock is None:
            raise WriterDown("no writer process to hand the stream to")
        self.link = link
        self.sid = pool.new_sid()
        self.started = False
        self.paused = False
        self._transport.pause_reading()        # the writer notices the client leaving
        ident = encoder.ident
        link.send([wire.OPEN, self.sid, self._chunked, ident.kind, ident.id, ident.created, ident.model,
                   ident.fingerprint, encoder.include_usage,
                   encoder.running.prompt_tokens if encoder.running is not None else None], [sock.fileno()])
        link.senders[self.sid] = self
        pool.handed += 1

    def _write(self, frame: bytes) -> None:
        if self.entry.client_gone:
            raise ConnectionResetError("the client closed the connection")
        self.link.send([wire.RAW, self.sid, frame.decode()])

    def writable(self) -> bool:
        return not (self.done or self.paused)

    def flush(self) -> None:
        if self.done or self.paused:
            return
        stream = self.stream
        # Plain output of an admitted stream (nearly every read) comes as (tokens, text), no Delta built.
        got = stream.take_text() if stream.__class__ is AdmittedStream else None
        if got is None:
            delta = stream.take()
            if delta is None:
                return
            if delta.finish_reason is not None:
                self._flush_final(delta)
                return
            got = len(delta.token_ids), delta.text
        tokens, text = got
        self.accepted.took(tokens)
        running = self._encoder.running
        if running is not None:
            running.count(tokens)               # this process's copy, for the final chunk's usage
        if text:
            self.started = True
            self.entry.last_write = now = _monotonic()
            self.link.add_text(self.sid, text, tokens)
            self._on_tokens(tokens, now, self.pushed_at)
        elif running is not None:
            self.link.add_text(self.sid, "", tokens)

    def _flush_final(self, delta: Delta) -> None:
        self.accepted.took(len(delta.token_ids))
        if self.started:
            self._encoder.mark_started()
        entry = self.entry
        entry.closing = True
        entry.final = delta
        self.send(b"".join(final_frames(delta, self._encoder, self._include_usage, entry.timed_out)))
        self._on_tokens(len(delta.token_ids))
        self.end()

    def on_report(self, kind: str) -> None:
        if kind == wire.GONE:
            if not self.entry.closing:
                self.stream.cancel()            # free its engine request now, as the watchdog would
            self.end(client_gone=True)
        elif kind == wire.BLOCKED:
            self.paused = True
        elif kind == wire.DRAINED:
            self.paused = False
            self.flush()

    def release(self) -> None:
        link = self.link
        link.senders.pop(self.sid, None)
        with contextlib.suppress(WriterDown):
            link.send([wire.CLOSE if not self.entry.client_gone else wire.ABORT, self.sid])
        # This process's copy of the socket: closed without a byte (the writer's copy keeps the
        # connection open), so the response's end aiohttp would write fails as a disconnect.
        self._transport.abort()

"""A handed-over stream's sender in the main process: its text goes to a writer process
(inferd.api.streaming.writers) once per loop turn, its final frames, pings and `[DONE]` as RAW."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from aiohttp.abc import AbstractStreamWriter

from inferd.api import appkeys as keys
from inferd.api.streaming import writer_wire as wire
from inferd.api.streaming.inflight import Flusher, Tracked, flush_or_end
from inferd.api.streaming.sse import Sender, final_frames
from inferd.api.streaming.writer_pool import WriterPool
from inferd.api.streaming.writers import WriterDown
from inferd.api.wire.responses import ChunkEncoder
from inferd.observability import RequestObservation, get_logger
from inferd.types import Delta

log = get_logger("inferd.api.streaming.handoff_sender")
_monotonic = time.monotonic
# Waiting for the headers to leave this process's transport before the socket goes over: 1 ms, doubling to 16 ms.
_POLL_FIRST_S, _POLL_MAX_S = 0.001, 0.016
# How much longer than its bound the end's acknowledgement is awaited from the writer before it counts as not given.
ACK_SLACK_S = 1.0


class HandoffSender(Sender):
    """A stream whose frames a writer process writes: its text goes out in the writer's STEP, the
    rest (final frames, pings, `[DONE]`) as RAW; this process's own copy of the socket is not written to.

    The socket goes over only once this process's transport holds nothing unsent (the headers, normally
    taken by the kernel at once): bytes left there would reach the client after the writer's. Until then the
    stream is not writable (its deltas merge in the RequestStream). What the client acknowledged is counted
    by the writer and lands in Tracked.accepted with its reports (GONE, TOOK, ACKED)."""

    __slots__ = ("acked", "flusher", "gone", "last_text", "link", "local", "obs", "opened", "opening", "paused", "pool",
                 "returned", "sid", "started", "timed")

    def __init__(self, entry: Tracked, writer: AbstractStreamWriter, encoder: ChunkEncoder, include_usage: bool,
                 obs: RequestObservation, *, pool: WriterPool) -> None:
        super().__init__(entry, writer, encoder, include_usage, obs)
        self.pool = pool
        self.obs = obs                      # the writer measures its frames' write delays and ITLs for its series
        self.last_text = 0.0                # when the last tokens were handed to the writer
        self.link = None
        self.sid = pool.new_sid()
        self.started = False                # text went to the writer (the final chunk is then not the first)
        self.timed = False                  # its first tokens' latency (TTFT) is observed
        self.paused = False
        self.opened = False
        self.gone = False                   # the writer reported the client gone (GONE)
        self.local = False                  # the handover failed: written here, as a plain Sender
        self.opening: asyncio.Task | None = None
        self.flusher: Flusher | None = None
        self.acked: asyncio.Future[bool] | None = None
        self.returned: asyncio.Future[bool] | None = None   # the stream's end: the writer hands the socket back
        if self._transport.get_write_buffer_size() == 0:
            self._open_or_keep()
        else:
            self.opening = asyncio.get_running_loop().create_task(self._open_once_sent())

    def _open_or_keep(self) -> None:
        """Hand the socket over: OPEN, with the fd. When no writer takes it (none alive, or the one picked is
        gone or too far behind), nothing has left this process yet: the stream is written here instead."""
        link = self.pool.pick()
        sock = self._transport.get_extra_info("socket")
        if link is None or sock is None:
            self._keep("no writer process alive")
            return
        self._transport.pause_reading()        # the writer notices the client leaving
        encoder = self._encoder
        ident = encoder.ident
        try:
            link.send([wire.OPEN, self.sid, self._chunked, ident.kind, ident.id, ident.created, ident.model,
                       ident.fingerprint, encoder.include_usage,
                       encoder.running.prompt_tokens if encoder.running is not None else None,
                       self.pool.series_number(self.obs.series)], [sock.fileno()])
        except WriterDown as exc:               # not sent: the socket is still this process's alone
            self._transport.resume_reading()
            self._keep(str(exc))
            return
        self.link = link
        link.senders[self.sid] = self
        self.opened = True
        self.pool.handed += 1

    async def _open_once_sent(self) -> None:
        transport, delay = self._transport, _POLL_FIRST_S
        while transport.get_write_buffer_size():       # no event says "sent": polled, as accepted.py does
            if transport.is_closing() or self.done:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        if self.done:
            return
        try:
            if transport.is_closing():
                raise ConnectionResetError("the client closed the connection")
            self._open_or_keep()
            self.flush()                    # what merged meanwhile
        except ConnectionError:
            self.stream.cancel()
            self.end(client_gone=True)
        except Exception:
            self.fail()

    def _keep(self, why: str) -> None:
        self.local = True
        self.pool.kept += 1
        log.warning("stream_written_in_process", reason=why, completion_id=self.stream.request_id)

    def _write(self, frame: bytes, content: bool = True) -> None:
        if not self.opened:                 # a ping while the headers wait, or kept here: this process's socket
            super()._write(frame, content)
            return
        if self.gone or self.entry.client_gone:
            raise ConnectionResetError("the client closed the connection")
        link, sid, taken = self.link, self.sid, self.accepted.taken
        for piece in wire.text_pieces(frame.decode()):
            link.send([wire.RAW, sid, piece, taken])

    def listener(self, flusher: Flusher) -> Callable[[], None]:
        self.flusher = flusher
        return self._has_output

    def _has_output(self) -> None:
        """New output: read in the writer pool's turn, which sends it in the STEP at once; the app's Flusher reads it
        while the socket is not over yet (it merges meanwhile) or when the stream is written here."""
        if self.opened:
            self.pool.reads.mark(self)
        else:
            self.flusher.mark(self)

    def writable(self) -> bool:
        if self.local:
            return Sender.writable(self)
        return self.opened and not (self.done or self.paused)

    def flush(self) -> None:
        if self.local:
            Sender.flush(self)
            return
        if self.done or self.paused or not self.opened:
            return
        got = self._read_output()
        if got is None:
            return
        tokens, text = got
        self.accepted.took(tokens)
        running = self._encoder.running
        if running is not None:
            running.count(tokens)               # this process's copy, for the final chunk's usage
        if text:
            self.started = True
            self.entry.last_write = self.last_text = now = _monotonic()
            self.link.add_text(self.sid, text, tokens, self.pushed_at)
            if not self.timed and tokens:       # TTFT: once handed over; the writer observes the ITLs and write
                self.timed = True               # delays as its socket takes the frames (DELAYS)
                self._on_tokens(tokens, now)
        elif tokens:        # text held back (a stop string, a character's bytes): the writer's count keeps up, so a
            self.link.add_text(self.sid, "", tokens)     # later frame's tokens (RAW's, by that count) are its own

    def _flush_final(self, delta: Delta) -> None:
        if self.local:
            Sender._flush_final(self, delta)
            return
        self.accepted.took(len(delta.token_ids))
        if self.started:
            self._encoder.mark_started()
        entry = self.entry
        entry.closing = True
        entry.final = delta
        self.send(b"".join(final_frames(delta, self._encoder, self._include_usage, entry.timed_out)))
        if not self.timed:                      # its first tokens: TTFT (the writer observes the ITL of later ones)
            self._on_tokens(len(delta.token_ids))
        elif delta.token_ids:
            self.last_text = _monotonic()
        self.end()

    def on_report(self, msg: list) -> None:
        """A report from the writer: [kind, sid, tokens, ...] (writer_wire); tokens None when the writer died."""
        kind, tokens = msg[0], msg[2]
        if tokens is not None:
            self.accepted.counted_elsewhere(tokens)
        if kind == wire.RETURNED or (kind == wire.GONE and self.returned is not None):   # GONE then: it died
            self._returned(kind == wire.RETURNED and bool(msg[3]))
            return
        if kind == wire.GONE:
            self.gone = True
            self._answer(ConnectionResetError("the client closed the connection"))   # a 200's wait for its ack
            if self.entry.closing:
                # Its final frames are written: the outcome is settled, and a client that hangs up now (the
                # SDK does, right after an error frame) is done, not gone, as Inflight.scan has it in-process.
                return
            self.stream.cancel()                # free its engine request now, as the watchdog would
            self.end(client_gone=True)
        elif kind == wire.ACKED:
            self._answer(bool(msg[3]))
        elif kind == wire.BLOCKED:
            self.paused = True
        elif kind == wire.DRAINED:
            self.paused = False
            flush_or_end(self)      # its final frames may be waiting, and the writer die as they are sent

    def _answer(self, outcome: bool | BaseException) -> None:
        acked = self.acked
        if acked is None or acked.done():
            return
        if isinstance(outcome, BaseException):
            acked.set_exception(outcome)
        else:
            acked.set_result(outcome)

    async def acknowledged(self, bound_s: float) -> bool:
        """SocketAccepted.acknowledged, asked of the writer: True once the client acknowledged every byte
        before the final frames (just sent), False past `bound_s`; ConnectionResetError: the client left."""
        if self.local:
            return await Sender.acknowledged(self, bound_s)
        if self.gone or self.entry.client_gone or not self.opened:
            raise ConnectionResetError("the client closed the connection")
        self.acked = acked = asyncio.get_running_loop().create_future()
        self.link.send([wire.ACK, self.sid, max(bound_s, 0.0)])     # WriterDown: a ConnectionError
        try:
            return await asyncio.wait_for(acked, max(bound_s, 0.0) + ACK_SLACK_S)
        except TimeoutError:
            return False
        finally:
            self.acked = None

    def _close_grace_s(self) -> float | None:
        request = self.entry.request
        return None if request is None else request.app[keys.STATE].config.server.stream_ack_timeout_s

    def release(self) -> None:
        if self.opening is not None:
            self.opening.cancel()
        if self.local:                      # written here to its end: aiohttp ends the response as usual
            return
        if self.timed:
            self.obs.last_token_at(self.last_text)
        link = self.link
        if link is not None:
            if not (self.gone or self.entry.client_gone):
                try:        # the last bytes get as long as a stream's end waits for its acknowledgement
                    link.send([wire.CLOSE, self.sid, self._close_grace_s()])
                except WriterDown:
                    pass
                else:       # handed back once written (RETURNED); then aiohttp ends the response here
                    self.returned = asyncio.get_running_loop().create_future()
                    return
            else:
                with contextlib.suppress(WriterDown):
                    link.send([wire.ABORT, self.sid])
            link.senders.pop(self.sid, None)
        # This process's copy of the socket: closed without a byte (the writer's copy, if any, ends it), so the
        # response's end aiohttp would write fails as a disconnect.
        self._transport.abort()

    def _returned(self, ok: bool) -> None:
        """The writer answered CLOSE: the connection is this process's again (`ok`; reading resumes for the client's
        next request, or aiohttp closes it as HTTP says), or the writer dropped it (closed here too). Done here, not by settle(),
        so a handler cancelled meanwhile leaves nothing behind."""
        returned = self.returned
        if returned is None or returned.done():
            return
        if self.link is not None:
            self.link.senders.pop(self.sid, None)
        if ok:
            self._transport.resume_reading()
        else:
            self._transport.abort()
        returned.set_result(ok)

    async def settle(self) -> None:
        """After release: before aiohttp ends the response, wait for the writer to hand the stream's socket
        back (its bytes are then in the kernel, ahead of the body's end written here). Past the writer's own
        bound for it, the connection is closed."""
        returned = self.returned
        if returned is None:
            return
        grace = self._close_grace_s()
        try:
            await asyncio.wait_for(asyncio.shield(returned), None if grace is None else grace + ACK_SLACK_S)
        except TimeoutError:
            self._returned(False)

"""Server-sent events: the streaming writer, heartbeats, and noticing clients that left.

One frame per merged delta and nothing queued: RequestStream hands the writer everything the
engine produced since the last read, so when the engine outruns what can be written (many
streams, fast steps, a slow client) tokens ride together in fewer, larger frames.

The per-frame path has no task wake-up: each stream's listener puts it on the app's Flusher,
which once per loop turn writes one frame for every stream that has output, straight to its
transport (chunked framing done here, as aiohttp's writer does). The request handler only sleeps
until its stream ends, or until its client stops reading: a transport over its high-water mark is
not written to (its deltas keep merging in the RequestStream, bounded by the request's own
output) and the handler waits for it to drain.

Everything periodic (heartbeats, disconnect checks, request timeouts) is done by one watchdog
task per app that scans the in-flight requests a few times a second, instead of a timer per read
(inferd.api.streaming.inflight, with the Flusher).
A client that disconnects is noticed either by a failed write or by the watchdog (its transport
is closing) and its engine request is aborted; the handler's `finally` aborts it too when aiohttp
cancels the handler.

Once the headers are out, the response is this stream and nothing else: a bug while writing is
logged and ends the stream with an `internal_error` frame and `[DONE]` (`Sender.fail`); it is never
raised to the middleware, which would write a second HTTP response into the chunked body.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from inferd.admission import AdmittedStream
from inferd.api.errors import SERVER_ERROR, ApiError
from inferd.api.streaming.inflight import Flusher, Inflight, Tracked
from inferd.api.wire.responses import OPENAI_FINISH, PING_FRAME, ChunkEncoder, abnormal_end
from inferd.engine import RequestStream
from inferd.observability import RequestObservation, get_logger, request_context
from inferd.types import Delta, FinishReason

_monotonic = time.monotonic
log = get_logger("inferd.api.streaming.sse")


class Sender:
    """The writing side of one event stream: frames go straight to the transport."""

    __slots__ = ("entry", "stream", "_transport", "_protocol", "_chunked", "_encoder", "_content",
                 "_include_usage", "_on_tokens", "waiter", "blocked", "done", "tee", "pushed_at", "accepted")

    def __init__(self, entry: Tracked, writer: AbstractStreamWriter, encoder: ChunkEncoder, include_usage: bool,
                 obs: RequestObservation) -> None:
        transport = writer.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.entry = entry
        self.stream = entry.stream
        self._transport = transport
        self._protocol = writer.protocol
        self._chunked = writer.chunked              # HTTP/1.1: chunked framing; HTTP/1.0: raw until close
        self._encoder = encoder
        self._content = encoder.content
        self._include_usage = include_usage
        self._on_tokens = obs.on_tokens
        self.waiter: asyncio.Future[None] | None = None
        self.blocked = False        # the transport is over its high-water mark: the handler awaits drain
        self.done = False
        self.tee: Callable[[bytes], None] | None = None   # also gets every frame (idempotency's replay copy)
        self.pushed_at: float | None = None     # when the pending output began (Flusher.mark)
        self.accepted = entry.accepted
        self.accepted.attach(transport)

    def send(self, frame: bytes) -> None:
        if not frame:       # an encoder holding text back (a tool call's start): a 0-length chunk would end the body
            return
        if self.tee is not None:
            self.tee(frame)
        self._write(frame)

    def _write(self, frame: bytes, content: bool = True) -> None:
        transport = self._transport
        if transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        data = b"%x\r\n%b\r\n" % (len(frame), frame) if self._chunked else frame
        transport.write(data)
        self.accepted.wrote(len(data), content)

    def listener(self, flusher: Flusher) -> Callable[[], None]:
        """What its stream calls on new output (RequestStream.listen): the app's Flusher writes it this turn."""
        return functools.partial(flusher.mark, self)

    def writable(self) -> bool:
        """May a frame be written now? Not once done, nor while the client is not keeping up: then
        the deltas stay pending (they merge) rather than buffering frames without bound, and the
        handler is woken to wait for the drain."""
        if self.blocked or self.done:
            return False
        if self._protocol.writing_paused:
            self.blocked = True
            self._wake()
            return False
        return True

    def _read_output(self) -> tuple[int, str] | None:
        """The stream's pending output as (tokens, text); None when there is none, or when it was the final
        delta (then written by _flush_final)."""
        stream = self.stream
        # Plain output of an admitted stream (nearly every read) comes as (tokens, text), no Delta built.
        got = stream.take_text() if stream.__class__ is AdmittedStream else None
        if got is None:
            delta = stream.take()
            if delta is None:
                return None
            if delta.finish_reason is not None:
                self._flush_final(delta)
                return None
            got = len(delta.token_ids), delta.text
        return got

    def flush(self) -> None:
        """Write what the stream has pending as one frame (or the final frames)."""
        if not self.writable():
            return
        got = self._read_output()
        if got is None:
            return
        tokens, text = got
        self.accepted.took(tokens)
        if text:
            now = self.entry.last_write = _monotonic()
            running = self._encoder.running
            self.send(self._content(text) if running is None else self._encoder.content_with_usage(text, tokens))
            self._on_tokens(tokens, now, self.pushed_at)
        elif self._encoder.running is not None:
            self._encoder.running.count(tokens)

    def _flush_final(self, delta: Delta) -> None:
        self.accepted.took(len(delta.token_ids))
        entry = self.entry
        entry.closing = True
        entry.final = delta
        self.send(b"".join(final_frames(delta, self._encoder, self._include_usage, entry.timed_out)))
        self._on_tokens(len(delta.token_ids))
        self.end()

    async def acknowledged(self, bound_s: float) -> bool:
        """True once the client acknowledged every byte written before the final frames, False past `bound_s`;
        ConnectionResetError: the client left (SocketAccepted.acknowledged, on this process's socket)."""
        return await self.accepted.acknowledged(bound_s)

    def ping(self) -> None:
        if not (self.blocked or self.done):
            with contextlib.suppress(ConnectionError):   # the watchdog's next scan sees a closed transport
                self._write(PING_FRAME, content=False)   # a keep-alive, not content: never replayed nor billed

    def end(self, *, client_gone: bool = False) -> None:
        self.done = True
        if client_gone:
            self.entry.client_gone = True
        self._wake()

    def fail(self) -> None:
        """Inside an `except` for an unexpected exception: log it, then end the stream as the
        protocol allows once headers are sent: an error frame, `[DONE]`, and the chunked stream's end."""
        entry = self.entry
        with request_context(entry.request_id or self.stream.request_id):
            log.exception("stream_failed", completion_id=self.stream.request_id)
        if self.done:
            return
        entry.failed = entry.closing = True
        rid = f" (request id {entry.request_id})" if entry.request_id else ""
        err = ApiError(500, f"Internal server error while streaming{rid}.", type=SERVER_ERROR, code="internal_error")
        with contextlib.suppress(ConnectionError):
            self.send(self._encoder.error(err, None) + self._encoder.closing)
        self.end()

    def withhold_done(self, err: ApiError) -> None:
        """Every content frame is out but the stream may not be acknowledged (its ledger row could not
        be committed): `err`'s frame goes where `[DONE]` would, so the client can tell."""
        self.entry.failed = self.entry.closing = True
        with contextlib.suppress(ConnectionError):
            self.send(self._encoder.error(err, None))

    def release(self) -> None:
        """The stream is over (whatever its end): nothing to do when frames went straight to the transport."""

    # A handed-over stream's end (HandoffSender): a future while its writer has yet to hand the socket back.
    returned: asyncio.Future[bool] | None = None

    async def settle(self) -> None:
        """After release, before aiohttp ends the response: nothing to wait for here (HandoffSender waits)."""

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def sse_response(headers: dict[str, str]) -> web.StreamResponse:
    resp = web.StreamResponse(headers=headers)
    resp.content_type = "text/event-stream"
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    return resp


async def stream_response(request: web.BaseRequest, stream: RequestStream, entry: Tracked,
                          encoder: ChunkEncoder, headers: dict[str, str], include_usage: bool,
                          obs: RequestObservation, inflight: Inflight, sender_class: type[Sender] = Sender,
                          prepared: tuple[web.StreamResponse, AbstractStreamWriter] | None = None,
                          before_done: Callable[[], Awaitable[None]] | None = None,
                          tee: Callable[[bytes], None] | None = None) -> web.StreamResponse:
    """Write `stream` as server-sent events; `sender_class` (default Sender) writes the frames.
    `prepared`: a response whose headers already went out (it waited in admission, inferd.api.streaming.waiting).
    `before_done`: awaited once the stream has ended normally, before `[DONE]` goes out (the encoder
    holds it back: `ChunkEncoder.hold_done`): the usage ledger's commit. `tee` gets every frame sent."""
    resp = sse_response(headers) if prepared is None else prepared[0]
    sender = None
    try:
        writer = await resp.prepare(request) if prepared is None else prepared[1]
        sender = sender_class(entry, writer, encoder, include_usage, obs)
        sender.tee = tee
        entry.last_write = _monotonic()
        entry.sender = sender
        stream.listen(sender.listener(inflight.flusher))     # new output -> this turn's flush
        sender.flush()                      # whatever arrived before the headers went out
        loop = asyncio.get_running_loop()
        while not sender.done:
            if sender.blocked:
                await writer.drain()
                entry.accepted.sample()
                sender.blocked = False
                sender.flush()
                continue
            sender.waiter = loop.create_future()
            await sender.waiter
        if before_done is not None and not (entry.client_gone or entry.failed):
            await before_done()
            # Every content frame is out: a client that hangs up on the final chunk (the SDK does on
            # an error frame) has had the whole response; the stream's status stays its own.
            with contextlib.suppress(ConnectionError):
                sender.send(encoder.held_done())
    except ConnectionError:
        entry.client_gone = True            # the caller's `finally` aborts the engine request
    except ApiError as err:                 # before_done refused the stream's end (no ledger row)
        if sender is None:
            raise
        sender.withhold_done(err)
    except Exception:
        if sender is None:
            raise                           # nothing sent yet: the middleware answers 500
        sender.fail()
    finally:
        stream.listen(None)
        if sender is not None:
            sender.done = True
            sender.release()
    if sender is not None and sender.returned is not None:
        await sender.settle()
    return resp


def final_frames(delta: Delta, encoder: ChunkEncoder, include_usage: bool, timed_out: bool) -> list[bytes]:
    finish = OPENAI_FINISH.get(delta.finish_reason)
    if finish is not None:
        frames = [encoder.final(delta.text, finish, len(delta.token_ids))]
        if include_usage and delta.usage is not None:
            frames.append(encoder.usage(delta.usage))
    else:
        reason = FinishReason.DEADLINE if timed_out else delta.finish_reason
        err: ApiError = abnormal_end(reason, delta.error)
        frames = [encoder.content(delta.text)] if delta.text else []
        frames.append(encoder.error(err, delta.usage))
    frames.append(encoder.done(delta.usage, delta.timing))
    return frames

"""Server-sent events: the streaming loop, heartbeats, and noticing clients that left.

One frame per merged delta and nothing queued: RequestStream hands the loop everything the
engine produced since the last read, so a slow client gets fewer, larger frames; a frame budget
(FRAME_BUDGET_PER_S) merges further when the engine outruns what the loop can write.

Per-delta work is kept minimal; everything periodic (heartbeats, disconnect checks, request
timeouts) is done by one watchdog task per app that scans the in-flight requests a few times
a second, instead of a timer per read. A client that disconnects is noticed either by a failed
write or by the watchdog (its transport is closing) and its engine request is aborted; the
handler's `finally` aborts it too when aiohttp cancels the handler.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from inferd.api.errors import ApiError
from inferd.api.responses import DONE_FRAME, OPENAI_FINISH, PING_FRAME, ChunkEncoder, abnormal_end
from inferd.engine.stream import RequestStream
from inferd.metrics import RequestObservation
from inferd.types import Delta, FinishReason

_monotonic = time.monotonic

# The process-wide budget of content frames per second, shared by the open streams: a stream may
# send its next frame `len(in-flight) / budget` seconds after its last one; tokens produced sooner
# ride in that next frame. A frame costs a syscall and a wake-up whatever it carries, so when an
# engine outruns what the loop can frame (many streams, fast steps), merging keeps tokens/s up.
# With GPU-speed steps (>= ~10 ms) the spacing is below the step time and nothing is held back;
# the first token is never delayed, and no token by more than one spacing. 0 turns it off.
FRAME_BUDGET_PER_S = 10_000.0
FRAME_SPACING_S = 1.0 / FRAME_BUDGET_PER_S


class Tracked:
    """One in-flight generation the watchdog looks after."""

    __slots__ = ("request", "stream", "resp", "last_write", "deadline", "timed_out", "closing", "client_gone",
                 "final")

    def __init__(self, request: web.BaseRequest, stream: RequestStream, deadline: float | None) -> None:
        self.request = request
        self.stream = stream
        self.resp: web.StreamResponse | None = None    # set once streaming headers are sent
        self.last_write = _monotonic()
        self.deadline = deadline
        self.timed_out = False
        self.closing = False                           # final frames being written: no more pings
        self.client_gone = False
        self.final: Delta | None = None                # the stream's last delta, once read


class Inflight:
    """The app's in-flight generations, and the watchdog task that scans them."""

    def __init__(self, heartbeat_s: Callable[[], float]) -> None:
        self._heartbeat_s = heartbeat_s     # read on every scan: a config reload takes effect
        self.entries: set[Tracked] = set()
        self._pings: set[asyncio.Task] = set()

    def add(self, request: web.BaseRequest, stream: RequestStream, timeout_s: float | None) -> Tracked:
        deadline = _monotonic() + timeout_s if timeout_s else None
        entry = Tracked(request, stream, deadline)
        self.entries.add(entry)
        return entry

    def discard(self, entry: Tracked) -> None:
        self.entries.discard(entry)

    async def cleanup_ctx(self, app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(self._watch(), name="inferd-sse-watchdog")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for entry in list(self.entries):
            entry.stream.cancel()

    async def _watch(self) -> None:
        while True:
            heartbeat = self._heartbeat_s()
            await asyncio.sleep(min(0.25, heartbeat / 2))
            self.scan(heartbeat)

    def scan(self, heartbeat: float) -> None:
        now = _monotonic()
        for entry in list(self.entries):
            transport = entry.request.transport
            if transport is None or transport.is_closing():
                entry.client_gone = True
                entry.stream.cancel()               # the client left: free its KV blocks now
                self.entries.discard(entry)
            elif entry.deadline is not None and now > entry.deadline:
                entry.timed_out = True
                entry.stream.cancel()
                self.entries.discard(entry)
            elif entry.resp is not None and not entry.closing and now - entry.last_write >= heartbeat:
                entry.last_write = now
                task = asyncio.get_running_loop().create_task(_ping(entry))
                self._pings.add(task)
                task.add_done_callback(self._pings.discard)


async def _ping(entry: Tracked) -> None:
    # Only reached while the handler waits for the engine, so frames are never interleaved.
    with contextlib.suppress(ConnectionError, RuntimeError):
        await entry.resp.write(PING_FRAME)


async def stream_response(request: web.BaseRequest, stream: RequestStream, entry: Tracked,
                          encoder: ChunkEncoder, headers: dict[str, str], include_usage: bool,
                          obs: RequestObservation, inflight: Inflight) -> web.StreamResponse:
    resp = web.StreamResponse(headers=headers)
    resp.content_type = "text/event-stream"
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    entries = inflight.entries
    try:
        await resp.prepare(request)
        entry.last_write = _monotonic()
        entry.resp = resp
        write = resp.write
        content = encoder.content
        on_tokens = obs.on_tokens
        next_frame_at = 0.0                 # the first token goes out at once
        while True:
            if next_frame_at:
                # This stream's share of the frame budget: wait out the spacing first, so whatever
                # the engine produces meanwhile merges into one frame (one wake-up per frame).
                wait = next_frame_at - _monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                next_frame_at = 0.0
            delta = await stream.__anext__()
            if delta.finish_reason is None:
                if delta.text:
                    now = entry.last_write = _monotonic()
                    await write(content(delta.text))
                    on_tokens(len(delta.token_ids), now)
                    if FRAME_SPACING_S:
                        next_frame_at = now + len(entries) * FRAME_SPACING_S
                continue
            entry.closing = True
            entry.final = delta
            for frame in final_frames(delta, encoder, include_usage, entry.timed_out):
                await write(frame)
            on_tokens(len(delta.token_ids))
            return resp
    except ConnectionError:
        entry.client_gone = True            # the caller's `finally` aborts the engine request
    return resp


def final_frames(delta: Delta, encoder: ChunkEncoder, include_usage: bool, timed_out: bool) -> list[bytes]:
    finish = OPENAI_FINISH.get(delta.finish_reason)
    if finish is not None:
        frames = [encoder.final(delta.text, finish)]
        if include_usage and delta.usage is not None:
            frames.append(encoder.usage(delta.usage))
    else:
        reason = FinishReason.DEADLINE if timed_out else delta.finish_reason
        err: ApiError = abnormal_end(reason, delta.error)
        frames = [encoder.content(delta.text)] if delta.text else []
        frames.append(encoder.error(err, delta.usage))
    frames.append(DONE_FRAME)
    return frames

"""The app's in-flight streams: each one's Tracked entry, the Flusher that writes every stream with new output
once per loop turn, and the watchdog (Inflight) that scans them for heartbeats, disconnects and deadlines
(inferd.api.streaming.sse writes the frames)."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from aiohttp import web

from inferd.api.streaming.accepted import SocketAccepted
from inferd.engine import RequestStream
from inferd.types import Delta


class FrameWriter(Protocol):
    """What the Flusher and the watchdog do with a stream's writer (inferd.api.streaming.sse.Sender)."""

    pushed_at: float | None

    def flush(self) -> None: ...
    def ping(self) -> None: ...
    def end(self, *, client_gone: bool = False) -> None: ...
    def fail(self) -> None: ...


_monotonic = time.monotonic
_perf = time.perf_counter
# A flush turn's budget (Flusher): about the engines' own slice of a busy loop (inferd.engine.sim's
# _SLICE_S), so that frames and steps take turns evenly; the clock is read every _CHECK_EVERY frames.
FLUSH_BUDGET_S = 0.002
_CHECK_EVERY = 16


class Tracked:
    """One in-flight generation the watchdog looks after."""

    __slots__ = ("request", "request_id", "stream", "sender", "last_write", "deadline", "timed_out", "closing",
                 "client_gone", "failed", "final", "accepted")

    def __init__(self, request: web.BaseRequest, stream: RequestStream, deadline: float | None,
                 request_id: str | None = None) -> None:
        self.request = request
        self.request_id = request_id
        self.stream = stream
        self.sender: FrameWriter | None = None         # set once streaming headers are sent
        self.last_write = _monotonic()
        self.deadline = deadline
        self.timed_out = False
        self.closing = False                           # final frames being written: no more pings
        self.client_gone = False
        self.failed = False                            # a bug ended the stream (an internal_error frame)
        self.final: Delta | None = None                # the stream's last delta, once read
        self.accepted = SocketAccepted()               # the tokens its client's socket took (billing)


class Flusher:
    """Writes one frame for every stream with new output, from one callback per loop turn.

    A turn writes for at most FLUSH_BUDGET_S; streams left over stay marked, oldest first, for the next
    turn, and their tokens keep merging meanwhile. With thousands of streams a full pass would take
    tens of milliseconds, during which the engines (stepping on this loop, or waiting on it for their
    outputs) and new requests wait, and every stream would get a frame per engine step: the cost of a
    frame (a send() each) is the front's cost per token. Bounded turns leave the engines their share
    and make frames fuller exactly when the loop is short of time; when it is not, every stream is
    written in the turn it got output, as before.

    `after` is called at the end of each turn (and of a turn `wake` asks for with nothing marked): the writer
    pool's, whose streams' "frames" are entries of a message to their writer process, sends those messages then.
    """

    __slots__ = ("_dirty", "_scheduled", "_after")

    def __init__(self, after: Callable[[], None] | None = None) -> None:
        self._dirty: collections.deque[FrameWriter] = collections.deque()
        self._scheduled = False
        self._after = after

    def mark(self, sender: FrameWriter) -> None:
        sender.pushed_at = _monotonic()         # the stream's oldest unsent output, from now
        self._dirty.append(sender)
        if not self._scheduled:
            self.wake()

    def wake(self) -> None:
        """A turn soon (also with no stream marked, for `after`)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        dirty = self._dirty
        deadline = _perf() + FLUSH_BUDGET_S
        n = 0
        while dirty:
            flush_or_end(dirty.popleft())
            n += 1
            if not n % _CHECK_EVERY and _perf() > deadline:
                break
        try:
            if self._after is not None:
                self._after()
        finally:                # even past a bug in `after`: marked streams must still get turns
            if dirty:
                asyncio.get_running_loop().call_soon(self._run)    # after what is ready now (engine steps)
            else:
                self._scheduled = False


def flush_or_end(sender: FrameWriter) -> None:
    """Write the stream's new output. A client (or writer process) gone ends the stream as a disconnect, and
    a bug ends it with an error frame; neither reaches the caller, which goes on to the other streams."""
    try:
        sender.flush()
    except ConnectionError:
        sender.end(client_gone=True)
    except Exception:   # a bug: end this stream with an error frame, not the others
        sender.fail()


class Inflight:
    """The app's in-flight generations, the watchdog task that scans them, and the frame flusher."""

    def __init__(self, heartbeat_s: Callable[[], float]) -> None:
        self._heartbeat_s = heartbeat_s     # read on every scan: a config reload takes effect
        self.entries: set[Tracked] = set()
        self.flusher = Flusher()

    def add(self, request: web.BaseRequest, stream: RequestStream, timeout_s: float | None,
            request_id: str | None = None) -> Tracked:
        deadline = _monotonic() + timeout_s if timeout_s else None
        entry = Tracked(request, stream, deadline, request_id)
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
            if entry.closing:
                # The final frames are written: the outcome is settled, and a client that hangs up
                # now (the SDK does, right after them) is done, not gone. The handler discards it.
                continue
            transport = entry.request.transport
            if transport is None or transport.is_closing():
                entry.client_gone = True
                entry.stream.cancel()               # the client left: free its KV blocks now
                self.entries.discard(entry)
            elif entry.deadline is not None and now > entry.deadline:
                entry.timed_out = True
                entry.stream.cancel()
                self.entries.discard(entry)
            else:
                entry.accepted.sample()             # what left user space while nothing was written
                if entry.sender is not None and now - entry.last_write >= heartbeat:
                    entry.last_write = now
                    entry.sender.ping()             # writes are synchronous: frames never interleave

"""A streaming request waiting in admission: its headers go out, and `: ping` comments keep it alive.

A proxy in front of inferd (nginx, an L7 balancer) cuts a response that sends nothing for its read
timeout. A streamed request queued behind others would be cut while it waits for its turn, so once
it has waited QUEUED_HEADERS_AFTER_S (or the heartbeat interval, if shorter) its SSE headers are sent
and a ping follows every heartbeat until admission lets it start. Refusals at the door (quota, a full
queue, a hopeless deadline) come before that and keep their HTTP status and Retry-After; a refusal
after the headers went out (class TTL, deadline, shed for higher-priority work) can only be an
`error` frame and `[DONE]`, the way a stream cut short ends. A request admitted within the wait is
answered exactly as before.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from inferd.api.errors import ApiError
from inferd.api.wire.responses import PING_FRAME, ChunkEncoder
from inferd.api.streaming.sse import sse_response

QUEUED_HEADERS_AFTER_S = 1.0
T = TypeVar("T")


class QueuedStream:
    """The response of one streaming request, started early if admission keeps it waiting."""

    def __init__(self, request: web.BaseRequest, headers: dict[str, str], heartbeat_s: float) -> None:
        self._request = request
        self._headers = headers
        self._heartbeat_s = heartbeat_s
        self.prepared: tuple[web.StreamResponse, AbstractStreamWriter] | None = None   # set once started

    async def wait(self, admitting: Awaitable[T]) -> T:
        """`admitting`'s result; while it is not there, headers (once) and pings. Leaving (the client
        went away, or this handler was cancelled) cancels `admitting`, which withdraws the request."""
        task = asyncio.ensure_future(admitting)
        try:
            if self.prepared is None:       # else its headers went out already, while its model loaded
                await asyncio.wait({task}, timeout=min(QUEUED_HEADERS_AFTER_S, self._heartbeat_s))
            if not task.done():
                if self.prepared is None:
                    resp = sse_response(self._headers)
                    self.prepared = (resp, await resp.prepare(self._request))
                resp = self.prepared[0]
                while not task.done():
                    await asyncio.wait({task}, timeout=self._heartbeat_s)
                    if not task.done():
                        await resp.write(PING_FRAME)      # a client that left: ConnectionError, and out
        except BaseException:
            task.cancel()
            raise
        return task.result()

    async def end_with(self, err: ApiError, encoder: ChunkEncoder) -> web.StreamResponse:
        """The request was refused after its headers went out: an `error` frame, then `[DONE]`."""
        if self.prepared is None:
            raise RuntimeError("end_with is for a response whose headers were sent")
        resp, _ = self.prepared
        await resp.write(encoder.error(err, None) + encoder.closing)
        await resp.write_eof()
        return resp

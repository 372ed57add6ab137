"""Which streams a writer process writes (inferd.api.streaming.writers), decided per request.

A stream can be handed over when the app has writer processes and its connection is plain TCP (an SSL
socket's state lives in this process: TLS streams are written here, as with no writers). Its response
says `Connection: close`: the writer closes the connection after the stream instead of handing it back
for another request. That header is set as soon as a stream may be handed over (before admission,
whose wait may send the headers early), so a stream that waited is handed over too.
"""
from __future__ import annotations

import functools

from inferd.api import appkeys as keys
from inferd.api.pipeline.context import RequestContext
from inferd.api.streaming.handoff_sender import HandoffSender
from inferd.api.streaming.writers import WriterPool
from inferd.api.wire.responses import ChunkEncoder


def writer_pool(ctx: RequestContext) -> WriterPool | None:
    """The writer processes this request's stream could go to: None without any, or over TLS."""
    pool = ctx.request.app.get(keys.WRITERS)
    if pool is None:
        return None
    transport = ctx.request.transport
    return None if transport is None or transport.get_extra_info("sslcontext") is not None else pool


def may_hand_over(ctx: RequestContext) -> None:
    """Before the headers can go out: a stream that may be handed over closes its connection at its end."""
    if writer_pool(ctx) is not None:
        ctx.headers["Connection"] = "close"


def handoff_sender(ctx: RequestContext, encoder) -> functools.partial[HandoffSender] | None:
    """The sender that hands this stream to a writer process, or None: no writers (or none alive), TLS, an encoder the
    writers do not have (tools, logprobs, another wire format), or headers that went out without
    `Connection: close` (sent while its model loaded)."""
    pool = writer_pool(ctx)
    if pool is None or type(encoder) is not ChunkEncoder or not pool.available:    # none left: written here
        return None
    sent = ctx.queued is not None and ctx.queued.prepared is not None
    if sent and ctx.headers.get("Connection") != "close":
        return None
    ctx.headers["Connection"] = "close"
    return functools.partial(HandoffSender, pool=pool)

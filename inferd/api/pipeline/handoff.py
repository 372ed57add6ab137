"""Which streams a writer process writes (inferd.api.streaming.writers), decided per request.

A stream can be handed over when the app has writer processes and its connection is plain TCP (an SSL
socket's state lives in this process: TLS streams are written here, as with no writers). A stream whose
headers went out while it waited for admission is handed over too. Its connection stays open for the
client's next request: the writer hands the socket back once the stream is written
(inferd.api.streaming.handoff_sender), and this process ends the response as it would its own.
"""
from __future__ import annotations

import functools

from inferd.api import appkeys as keys
from inferd.api.pipeline.context import RequestContext
from inferd.api.streaming.handoff_sender import HandoffSender
from inferd.api.streaming.writer_pool import WriterPool
from inferd.api.wire.responses import ChunkEncoder


def writer_pool(ctx: RequestContext) -> WriterPool | None:
    """The writer processes this request's stream could go to: None without any, or over TLS."""
    pool = ctx.request.app.get(keys.WRITERS)
    if pool is None:
        return None
    transport = ctx.request.transport
    return None if transport is None or transport.get_extra_info("sslcontext") is not None else pool


def handoff_sender(ctx: RequestContext, encoder) -> functools.partial[HandoffSender] | None:
    """The sender that hands this stream to a writer process, or None: no writers (or none alive), TLS, or an encoder
    the writers do not have (tools, logprobs, another wire format)."""
    pool = writer_pool(ctx)
    if pool is None or type(encoder) is not ChunkEncoder or not pool.available:    # none left: written here
        return None
    return functools.partial(HandoffSender, pool=pool)

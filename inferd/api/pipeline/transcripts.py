"""Keeping a request's text for tenants whose retention allows it (inferd.store.transcripts).

Only when the tenant's `retention` is a period and the node has a store. The write happens after
the response, in the background (a debugging record must never delay or fail a response); at most
MAX_PENDING writes wait at once, beyond that a record is dropped and counted in the log.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.safety import input_text
from inferd.observability import get_logger
from inferd.store import StoreError, Transcript

log = get_logger("inferd.api")
MAX_PENDING = 256


def retention_s(ctx: RequestContext) -> float:
    """How long `ctx`'s text may be kept: 0 unless its tenant has a retention period and there is a store."""
    if ctx.state.transcripts is None:
        return 0.0
    return ctx.state.tenancy.tenants.get(ctx.tenant).retention_s


def keep(ctx: RequestContext, recording: Any, seconds: float) -> None:
    """Write `ctx`'s prompt and what its client received (`recording.whole()`) in the background, to be
    kept `seconds` (retention_s(ctx); 0: not at all)."""
    whole = recording.whole() if recording is not None else None
    if not seconds or whole is None:
        return
    state = ctx.state
    pending = state.transcript_writes
    if len(pending) >= MAX_PENDING:
        log.warning("transcript_dropped", request_id=ctx.request_id, reason="too many writes pending")
        return
    now = time.time()
    record = Transcript(request_id=ctx.request_id, tenant=ctx.tenant, model=ctx.model, created_at=now,
                        expires_at=now + seconds, prompt="", completion=whole.text)
    task = asyncio.ensure_future(_write(state.transcripts, record, ctx))
    pending.add(task)
    task.add_done_callback(pending.discard)


async def _write(transcripts, record: Transcript, ctx: RequestContext) -> None:
    try:
        # The prompt's text (messages joined, token ids decoded) is built off the loop: it can be long.
        prompt = await asyncio.to_thread(input_text, ctx.prepared, ctx.engine)
        await transcripts.record(msgspec.structs.replace(record, prompt=prompt))
    except StoreError as exc:
        log.warning("transcript_not_written", request_id=record.request_id, error=str(exc))

"""The one way out of the pipeline: what every request's end records, whatever ended it.

How far the request got (context.FRONT .. RUNNING) decides what there is to record:
- refused by the cheap checks: the refusal counted, its SLO event, refusal pacing charged;
- in flight: the ledger row (once admission was asked, unless a peer served it), the metrics
  observation, the rollout/breaker outcome, the response cache and transcript, the trace, the SLO
  event and the log line's fields;
- always: the pacing turn closed, the routed version released, the Idempotency-Key settled.
"""
from __future__ import annotations

import time

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.pipeline import idempotency
from inferd.api.pipeline.admit import refused_bytes
from inferd.api.pipeline.cached import store as store_in_cache
from inferd.api.errors import CLIENT_GONE, ApiError
from inferd.api.pipeline.context import CHARGED, FRONT, RUNNING, RequestContext
from inferd.api.pipeline.slo_outcomes import record_slo, record_slo_for
from inferd.api.pipeline.transcripts import keep as keep_transcript
from inferd.api.pipeline.usage import record_usage
from inferd.api.pipeline.versioned import record_outcome
from inferd.types import Delta


async def record_usage_once(ctx: RequestContext, final: Delta | None, status: int, *, withhold: bool = False) -> None:
    """The ledger row, once, committed before the response's last bytes (inferd.api.pipeline.usage); a response
    that would complete (`withhold`) becomes 503 store_unavailable if its row cannot be."""
    if ctx.recorded:
        return
    ctx.recorded = True
    delivered = ctx.delivered.delivered_tokens if ctx.delivered is not None else 0
    await record_usage(ctx, status, final, delivered, withhold=withhold)


async def settle(ctx: RequestContext, status: int, error: BaseException | None,
                 response: web.StreamResponse | None) -> None:
    try:
        if ctx.reached == FRONT:
            _settle_refused(ctx, status, error)
        else:
            try:
                await _settle_in_flight(ctx, status)
            finally:
                ctx.tracked.__exit__(None, None, None)
    finally:
        ctx.turn.close()
        ctx.version_lease.release()
        await idempotency.settle(ctx.request, ctx.state, response)     # keep a 200 for replays, else release


def _settle_refused(ctx: RequestContext, status: int, error: BaseException | None) -> None:
    """Answered or refused before it was in flight: no ledger row, no trace."""
    state = ctx.state
    _record_version_outcome(ctx, status)
    if isinstance(error, ApiError):
        state.metrics.count_rejected(ctx.model, status, ctx.engine)
        if ctx.route is not None:
            record_slo(state, ctx.route, ctx.tenant, status, batch=ctx.is_batch, forwarded=ctx.forwarded)
        ctx.turn.refused(status, refused_bytes(ctx.request, status, ctx.body, state.config.server.max_body_bytes))
        if ctx.headers_out:     # its headers went out while its model loaded: it ends with an error frame
            ctx.log_fields["outcome_status"] = status
    elif status == CLIENT_GONE:
        ctx.turn.refused(CLIENT_GONE, len(ctx.body))


async def _settle_in_flight(ctx: RequestContext, status: int) -> None:
    last, obs = ctx.last, ctx.obs
    by_peer = ctx.served_by_peer
    if ctx.reached >= CHARGED and not by_peer:
        await record_usage_once(ctx, last, status)      # the client left, or a bug: what was delivered is billed
    usage = last.usage if last is not None else None
    timing = last.timing if last is not None else None
    running = ctx.reached == RUNNING
    # One reading of the stages for the histogram and the trace (Server-Timing read the same marks).
    stages = ctx.timeline.stages(timing, time.monotonic()) if running else {}
    obs.finish(status, usage=usage, timing=timing, stages=stages)
    _record_version_outcome(ctx, status)
    if running and ctx.endpoint.generates:
        store_in_cache(ctx, ctx.cache_plan, status, ctx.recording.whole() if ctx.recording is not None else None)
        keep_transcript(ctx, ctx.recording, ctx.extras.get("retention_s", 0.0))
    trace = ctx.request.get(keys.TRACE)
    if trace is not None:
        trace.end(status, stages,
                  {"inferd.completion_tokens": usage.completion_tokens if usage is not None else 0} if running else {})
    if not by_peer:
        record_slo_for(ctx, status, obs=obs, streamed=ctx.streamed or ctx.headers_out)
    fields = ctx.log_fields
    if usage is not None:
        fields.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                      cached_tokens=usage.cached_tokens)
    if obs.ttft is not None and ctx.endpoint.generates:
        fields["ttft_ms"] = round(obs.ttft * 1000, 3)
    fields["outcome_status"] = status


def _record_version_outcome(ctx: RequestContext, status: int) -> None:
    """What the version did, for its rollouts and breaker: a cache hit or a refusal in admission says
    nothing about it; an engine that refused the request as unavailable does."""
    route = ctx.route
    if ctx.engine_failed:       # up front (health check) its breaker counts it even for an adapter request
        record_outcome(ctx.state, route.target, None, 503, None,
                       adapter=route.lora if ctx.reached > FRONT else None, judged=route.tier is None)
    elif ctx.cache_hit is None and (ctx.reached == RUNNING or ctx.last is not None):
        ttft = ctx.obs.ttft if ctx.endpoint.generates else None    # an embedding has no first token
        record_outcome(ctx.state, route.target, ctx.last, status, ttft, adapter=route.lora, judged=route.tier is None)

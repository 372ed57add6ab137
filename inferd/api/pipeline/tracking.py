"""The stage where a request that passed every cheap check becomes work in flight: counted for a drain,
traced, observed, its response headers named.
"""
from __future__ import annotations

from inferd.api import appkeys as keys
from inferd.api.pipeline.context import TRACKED, RequestContext
from inferd.engine import Engine
from inferd.observability import truncated_path


def version_label(engine: Engine) -> str:
    """The version clients see: sim engines say so in the version itself (`sim-...+simulated`)."""
    info = engine.info
    return f"{info.version}+simulated" if info.simulated else info.version


async def begin_tracking(ctx: RequestContext) -> None:
    """In flight from here (a drain waits for it), with its refusal-pacing turn given back, a trace span
    when [tracing] is configured, and the metrics observation its end finishes."""
    state, request, engine = ctx.state, ctx.request, ctx.engine
    ctx.turn.close()
    ctx.tracked = state.track()
    ctx.tracked.__enter__()
    ctx.obs = state.metrics.start_request(ctx.model, ctx.arrival, engine)    # the version that serves it
    ctx.reached = TRACKED
    label = version_label(engine)
    if state.tracing is not None:
        path = truncated_path(request.path)     # as the log line has it: a client picks the path's length
        request[keys.TRACE] = state.tracing.begin(
            f"inferd {path}", request.headers, ctx.arrival,
            {"inferd.request_id": ctx.request_id, "inferd.model": ctx.model, "inferd.version": label,
             "inferd.tenant": ctx.tenant, "http.request.method": request.method, "url.path": path})
    if "traceparent" in request.headers:        # ties the log line to the caller's trace (W3C trace context)
        ctx.log_fields["traceparent"] = request.headers["traceparent"][:128]
    ctx.headers.update({"X-Request-Id": ctx.request_id, "X-Inferd-Model-Version": label})
    if engine.info.simulated:
        ctx.headers["X-Inferd-Simulated"] = "true"

"""Finished requests to the node's SLO tracker (inferd.slo): what was asked, how it ended, how fast.

Called once per request where its metrics are finished: after routing (it is known which model it
asked for) and whatever the outcome. A node with no `[slos.*]` pays one truth test. Not judged here:
- lines of a batch job (the Batch API's own runner retries them; a job is not interactive traffic);
- a forwarded request this node refuses with a status its origin answers by trying elsewhere (the
  origin serves it, and it is judged where it is served).
"""
from __future__ import annotations

from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.spill import TRY_ELSEWHERE
from inferd.api.state import ServerState
from inferd.models import Route
from inferd.observability import RequestObservation
from inferd.slo import RequestOutcome


def record_slo(state: ServerState, route: Route, tenant: str, status: int, *, batch: bool = False,
               forwarded: bool = False, client_deadline: bool = False, streamed: bool = False,
               obs: RequestObservation | None = None, judge_itl: bool = True) -> None:
    """`client_deadline`: the client set a deadline shorter than the server's (its 504 is no server
    failure); `streamed`: SSE headers went out; `obs`: the finished observation (TTFT, mean ITL);
    `judge_itl`: one choice (a mean gap over several choices' tokens would be too small)."""
    tracker = state.slos
    if not tracker or batch or (forwarded and status in TRY_ELSEWHERE):
        return
    tracker.record(RequestOutcome(
        requested=route.alias or route.target.model, model=route.target.model,
        priority=state.tenancy.tenants.get(tenant).priority, status=status, streamed=streamed,
        client_deadline=client_deadline, ttft_s=obs.ttft if obs is not None else None,
        itl_s=obs.mean_itl if obs is not None and judge_itl else None,
        latency_s=obs.latency if obs is not None else None))


def record_slo_for(ctx: RequestContext, status: int, *, streamed: bool = False,
                   obs: RequestObservation | None = None) -> None:
    """record_slo for a request whose facts are all known (after tokenizing)."""
    state = ctx.state
    server_budget = min(state.config.server.request_timeout_s,
                        state.tenancy.tenants.get(ctx.tenant).max_request_timeout_s)
    record_slo(state, ctx.route, ctx.tenant, status, batch=ctx.batch_id is not None, forwarded=ctx.forwarded,
               client_deadline=ctx.deadline < ctx.arrival + server_budget - 1e-6, streamed=streamed, obs=obs,
               judge_itl=len(ctx.prompt_ids) == 1)

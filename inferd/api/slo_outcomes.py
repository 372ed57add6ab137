"""Finished requests to the node's SLO tracker (inferd.slo): what was asked, how it ended, how fast.

Called once per request where its metrics are finished: after routing (it is known which model it
asked for) and whatever the outcome. A node with no `[slos.*]` pays one truth test.
"""
from __future__ import annotations

from inferd.api.state import ServerState
from inferd.config import PriorityClass
from inferd.models import Route
from inferd.observability import RequestObservation
from inferd.slo import RequestOutcome


def record_slo(state: ServerState, route: Route, tenant: str, status: int, *, batch: bool = False,
               streamed: bool = False, obs: RequestObservation | None = None) -> None:
    """`streamed`: SSE headers went out; `obs`: the request's finished observation (TTFT, mean ITL)."""
    tracker = state.slos
    if not tracker:
        return
    priority = PriorityClass.BATCH if batch else state.tenancy.tenants.get(tenant).priority
    tracker.record(RequestOutcome(
        requested=route.alias or route.target.model, model=route.target.model, priority=priority, status=status,
        streamed=streamed, ttft_s=obs.ttft if obs is not None else None,
        itl_s=obs.mean_itl if obs is not None else None))

"""Overload degradation (`[degrade.<route>]`): keep the interactive SLO before anything is shed.

While the admission queue in front of a route's engine is past its configured pressure, requests of
the listed classes have `max_tokens` capped (they end with finish_reason "length" sooner) or are sent
to another model; the response says so in `X-Inferd-Degraded`, and inferd_degraded_requests_total
counts it. Nothing is decided for requests of other classes or routes without a table: one dict
lookup. The cheap checks (class listed?) come before looking at the queue.
"""
from __future__ import annotations

import msgspec

from inferd.api.errors import ApiError
from inferd.api.state import ServerState
from inferd.api.pipeline.versioned import check_breaker, route_request
from inferd.config import DegradeConfig, PriorityClass
from inferd.models import Route

DEGRADED_HEADER = "X-Inferd-Degraded"


class Degradation(msgspec.Struct, frozen=True):
    route: Route
    max_tokens: int | None = None      # the cap on this request's output, when capped
    header: str = ""                   # X-Inferd-Degraded: what was done ("" = nothing)

def _overloaded(state: ServerState, route: Route, cfg: DegradeConfig) -> bool:
    engine = state.registry.table.engine(route.target)
    if cfg.batch_fill_over is not None:
        slots = engine.info.max_batch_size
        if slots and 1 - engine.capacity().free_slots / slots > cfg.batch_fill_over:
            return True
    if cfg.queued_over is None and cfg.oldest_wait_over_s is None:
        return False
    queued, oldest_s = state.tenancy.queue_for(route.target.model, engine).pressure()
    return ((cfg.queued_over is not None and queued > cfg.queued_over)
            or (cfg.oldest_wait_over_s is not None and oldest_s > cfg.oldest_wait_over_s))


def degrade(state: ServerState, route: Route, tenant: str, batch: bool, user: str | None,
            request_id: str) -> Degradation:
    name = route.alias or route.target.model
    cfg = state.config.degrade.get(name) if state.config.degrade else None
    if cfg is None:
        return Degradation(route)
    cls = PriorityClass.BATCH if batch else state.tenancy.tenants.get(tenant).priority
    cap, target = cfg.max_tokens.get(cls), cfg.route.get(cls)
    if cap is None and target is None:
        return Degradation(route)
    if not _overloaded(state, route, cfg):
        return Degradation(route)
    done = []
    if target is not None and route.lora is None:     # an adapter request is not served without its adapter
        try:
            other = check_breaker(state, route_request(state, target, tenant, user, request_id, batch=batch),
                                  tenant, user, request_id)
        except ApiError:        # the smaller model cannot take it now: it stays where it was routed
            other = None
        if other is not None:
            route = msgspec.structs.replace(other, alias=name, lora=None)   # still judged against `name`'s SLOs
            state.metrics.count_degraded(name, "route")
            done.append(f"route={other.target.model}")
    if cap is not None:
        state.metrics.count_degraded(name, "max_tokens")
        done.append(f"max_tokens={cap}")
    return Degradation(route, cap, "; ".join(done))

"""Spillover's decision: does a request go to a peer, and how long may that peer keep it waiting?

Asked after routing, tokenization and quota, just before admission (inferd.api.pipeline.admission);
inferd.api.pipeline.spill then forwards it. Costs one look at the local queue's load and two dict
lookups for the request's TTFT budget (inferd.slo.SloTracker.ttft_budget_s).
"""
from __future__ import annotations

import time

from inferd.api.pipeline.context import RequestContext
from inferd.cluster import Cluster
from inferd.config import PriorityClass

__all__ = ["BUDGET_FRACTION", "PEER_WAIT_LIMIT", "peer_wait_limit", "wants_spill"]

PEER_WAIT_LIMIT = "spill_peer_wait_limit_s"       # ctx.extras: set by wants_spill for spill
# The queue's wait is an estimate of the mean (completions come in bursts), and a TTFT SLO bounds nearly
# every request: kept here until its estimate reached the whole budget, 22% of those served at home
# missed it (bench, 2x offered; under 1% at half). So a request spills past half of what is left, as
# early refusal judges the deadline (early_refusal_fraction); a peer with a free slot starts it at once.
BUDGET_FRACTION = 0.5


def wants_spill(ctx: RequestContext) -> bool:
    """Would this node refuse the request, or start it later than its TTFT budget allows (and may it go
    elsewhere)? If so, how long a peer may keep it waiting is left in ctx.extras for `spill`."""
    cluster = ctx.state.cluster
    if cluster is None or not cluster.config.spillover or ctx.forwarded or ctx.route.lora is not None \
            or not ctx.endpoint.spillable:     # e.g. the Responses API: it needs this node's store
        return False
    if "max_tokens=" in ctx.degraded:       # the peer would run the body as sent, without this node's cap
        return False
    within = peer_wait_limit(ctx, cluster)
    if within is None:
        return False
    ctx.extras[PEER_WAIT_LIMIT] = within
    return True


def peer_wait_limit(ctx: RequestContext, cluster: Cluster) -> float | None:
    """The longest a peer may keep the request waiting for it to go there; None: it stays here.

    A request the local queue would refuse (at its node bounds, or its estimated wait past what early
    refusal allows before the deadline) goes to any peer that would not refuse it in turn. Else one
    whose estimated local wait exceeds BUDGET_FRACTION of what is left of its TTFT budget goes to a
    peer whose own wait is within that (at once, when the budget is spent already). The budget: the
    tightest `ttft` SLO threshold judging the request ([slos.*]), else `spill_wait_s`."""
    tenancy = ctx.state.tenancy
    queue = tenancy.queue_for(ctx.model, ctx.engine)
    load = queue.load()
    now = time.monotonic()
    policy = queue.policy
    priority = PriorityClass.BATCH if ctx.is_batch else tenancy.tenants.get(ctx.tenant).priority
    refusable_s = (min(ctx.deadline, now + policy.ttl_s(priority)) - now) * (
        policy.early_refusal_fraction if policy.early_refusal else 1.0)
    if load.full or load.wait_s > refusable_s:
        return max(refusable_s, 0.0)
    route = ctx.route
    budget = ctx.state.slos.ttft_budget_s(route.alias or route.target.model, route.target.model, priority)
    budget_s = budget if budget is not None else cluster.config.spill_wait_s
    # Clamped at 0, so a wait of 0 (the queue's word that it starts now, QueueLoad.wait_s) never spills: a
    # budget spent before admission (a slow upload, a long prompt) is no reason to add a hop and a second
    # tokenization.
    left = max((budget_s - (now - ctx.arrival)) * BUDGET_FRACTION, 0.0)
    return left if load.wait_s > left else None

"""The stages of a generation from its response's identity to the engine: charge the tenant's quota,
the response cache, a peer with room, and the engine's weighted-fair admission queue.
"""
from __future__ import annotations

import asyncio

from aiohttp import web

from inferd import __version__
from inferd.api.pipeline.admit import admit, charge
from inferd.api.pipeline.cached import cache_plan, lookup, replay
from inferd.api.pipeline.degrade import DEGRADED_HEADER
from inferd.api.errors import ApiError, invalid, unavailable
from inferd.api.pipeline.context import CHARGED, RUNNING, RequestContext
from inferd.api.wire.responses import new_identity
from inferd.api.pipeline.spill import NODE_HEADER, spill
from inferd.api.pipeline.spill_decision import wants_spill
from inferd.api.pipeline.versioned import make_room_for_live
from inferd.api.streaming.waiting import QueuedStream
from inferd.config import PriorityClass
from inferd.engine import EngineUnavailable, InvalidRequest
from inferd.types import GenerationRequest


async def name_the_response(ctx: RequestContext) -> None:
    """The completion's id, the served model (`name@version[:adapter]`), and the headers saying how it
    was served (degraded, by which node)."""
    engine, route = ctx.engine, ctx.route
    label = ctx.headers["X-Inferd-Model-Version"]
    served = f"{ctx.model}@{label}" if route.lora is None else f"{ctx.model}@{label}:{route.lora}"
    ctx.extras["ident"] = new_identity(ctx.kind, served, f"inferd-{__version__}-{engine.info.backend}")
    if ctx.degraded:
        ctx.headers[DEGRADED_HEADER] = ctx.degraded
    if ctx.state.cluster is not None:
        ctx.headers[NODE_HEADER] = ctx.state.cluster.node_id


async def charge_quota(ctx: RequestContext) -> None:
    """One engine request per choice, charged against the tenant once, on the node that authenticated it
    (429 when its buckets have no room). From here the request has a ledger row."""
    cid = ctx.extras["ident"].id
    gens = []
    for i, (ids, params) in enumerate(zip(ctx.prompt_ids, ctx.sampling)):
        if i % ctx.choices_per_prompt == 0:     # a prompt's n choices need the same room: ask once
            make_room_for_live(ctx.state, ctx.engine, len(ids), params)
        gens.append(GenerationRequest(request_id=cid if i == 0 else f"{cid}-{i}", prompt_token_ids=tuple(ids),
                                      sampling=params, tenant=ctx.tenant, lora=ctx.route.lora))
    ctx.extras["gens"] = gens
    ctx.reached = CHARGED
    ctx.quota_lease = None if ctx.forwarded else charge(ctx.state.tenancy, ctx.tenant, gens, ctx.choices_per_prompt)


async def look_up_cache(ctx: RequestContext) -> None:
    """The response cache: a hit runs nothing."""
    ctx.cache_plan = cache_plan(ctx)
    ctx.cache_hit = lookup(ctx, ctx.cache_plan, ctx.headers)


async def spill_to_peer(ctx: RequestContext) -> web.StreamResponse | None:
    """In a cluster: a peer with room serves a request this node would refuse or keep waiting."""
    lease = ctx.quota_lease
    if ctx.cache_hit is not None or lease is None or ctx.headers_out or not wants_spill(ctx):
        return None
    ctx.served_by_peer = True     # while a peer has it, the peer records, bills and judges it
    try:
        spilled = await spill(ctx, lease, {**lease.headers, "X-Request-Id": ctx.request_id})
    except (asyncio.CancelledError, ConnectionError):     # its client left before a peer answered
        lease.release(None)
        raise
    ctx.served_by_peer = spilled is not None     # no peer took it: it runs here
    return spilled


async def wait_for_admission(ctx: RequestContext) -> None:
    """The engine's fair admission queue (429/503/504), which submits when the engine has room; a stream
    kept waiting gets its headers and pings meanwhile (inferd.api.streaming.waiting)."""
    if ctx.headers_out:
        ctx.queued = ctx.early
    elif ctx.prepared.stream and ctx.cache_hit is None:
        ctx.queued = QueuedStream(ctx.request, ctx.headers, ctx.state.config.server.heartbeat_interval_s)
    if ctx.cache_hit is not None:
        admitting = replay(ctx, ctx.extras["ident"].id, ctx.cache_hit, ctx.quota_lease)
    else:
        admitting = admit(ctx.state.tenancy, ctx.tenant, ctx.model, ctx.engine, ctx.extras["gens"], ctx.deadline,
                          ctx.quota_lease, priority=PriorityClass.BATCH if ctx.is_batch else None,
                          choices_per_prompt=ctx.choices_per_prompt)
    try:
        ctx.extras["admitted"] = await (ctx.queued.wait(admitting) if ctx.queued is not None else admitting)
    except (InvalidRequest, EngineUnavailable) as exc:
        raise engine_refusal(ctx, exc) from None
    ctx.reached = RUNNING


def engine_refusal(ctx: RequestContext, exc: InvalidRequest | EngineUnavailable) -> ApiError:
    """The engine's refusal at submit, in the envelope: a 400 naming the field, or 503 (the version's
    failure, which its breaker and rollouts count)."""
    if isinstance(exc, InvalidRequest):
        return invalid(str(exc), param=exc.param)
    ctx.engine_failed = True
    return unavailable(f"The engine serving `{ctx.model}` is unavailable: {exc}", code="engine_unavailable")

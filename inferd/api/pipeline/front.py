"""The front stages every endpoint shares, cheapest refusals first: who asks, may they, what they sent,
until when, whether it ran already, and which version serves it.

Each stage takes the RequestContext, fills its part, and raises an ApiError to refuse; one that
answers the request itself (an idempotent replay, a peer serving a cold model) returns the response.
"""
from __future__ import annotations

from aiohttp import web

from inferd.api.pipeline import idempotency
from inferd.api.pipeline.admit import (
    check_model_allowed,
    pace_refusals,
    precheck_quota,
    request_deadline,
)
from inferd.api.auth import authenticate
from inferd.api.pipeline.body import check_json_content_type, read_body
from inferd.api.pipeline.cold_start import early_stream, spill_cold_start, wait_for_model
from inferd.api.pipeline.degrade import degrade
from inferd.api.errors import draining, store_unavailable, unavailable
from inferd.api.pipeline.internal import batch_caller
from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.spill import VERSION_HEADER, check_forwarded_body, forwarded_identity
from inferd.api.pipeline.usage import check_ledger
from inferd.api.pipeline.versioned import check_breaker, priority_class, route_request
from inferd.cluster import FORWARDED_HEADER
from inferd.store import REQUEST_DEADLINE


async def refuse_while_draining(ctx: RequestContext) -> None:
    if ctx.state.draining:
        raise draining()


async def refuse_while_store_fails(ctx: RequestContext) -> None:
    """503 while the ledger is failing or the store does not answer its ping: nothing runs that cannot
    be billed, and nothing waits on a store that is down."""
    check_ledger(ctx.state)
    if ctx.state.store_failure() is not None:
        raise store_unavailable(ctx.state.config.store.ping_interval_s)


async def authenticate_caller(ctx: RequestContext) -> None:
    """The tenant: signed by the peer that forwarded it, the Batch API's runner's line, or the API key
    (401/403 before anything about the body); then 429 over RPM or concurrency, before reading it."""
    request, state = ctx.request, ctx.state
    ctx.forwarded = ctx.endpoint.spillable and FORWARDED_HEADER in request.headers
    batch = batch_caller(request, state.batch_secret)
    if ctx.forwarded:       # the peer authenticated and charged the caller; it signed who they are
        ctx.forwarded_identity = forwarded_identity(request, state.cluster)
        ctx.tenant = ctx.forwarded_identity.tenant
        return
    if batch is not None:
        ctx.tenant, ctx.batch_id, ctx.is_batch = batch[0], batch[1], True
    else:
        ctx.tenant = authenticate(request, "inference").tenant
    precheck_quota(state.tenancy, ctx.tenant)


async def pace_refused_tenant(ctx: RequestContext) -> None:
    """A tenant whose requests keep being refused waits its turn before its body is read."""
    if not ctx.forwarded and not ctx.is_batch:
        ctx.turn = await pace_refusals(ctx.state.tenancy, ctx.tenant, ctx.request)


async def read_request_body(ctx: RequestContext) -> None:
    check_json_content_type(ctx.request)
    ctx.body = await read_body(ctx.request, ctx.state.config.server.max_body_bytes)
    if ctx.forwarded:       # the peer's signature covers this body only
        check_forwarded_body(ctx.state.cluster, ctx.forwarded_identity, ctx.body)


async def set_deadline(ctx: RequestContext) -> None:
    state = ctx.state
    ctx.deadline = request_deadline(ctx.request, ctx.prepared if ctx.endpoint.generates else ctx.wire,
                                    state.tenancy, ctx.tenant, state.config.server, ctx.arrival)
    REQUEST_DEADLINE.set(ctx.deadline)      # store calls from here on give up before it (docs/store.md)


async def claim_idempotency_key(ctx: RequestContext) -> web.StreamResponse | None:
    """Idempotency-Key: the stored response replayed, or 409/422; else the key is held until settle."""
    return await idempotency.claim(ctx.request, ctx.state, ctx.tenant, ctx.body, ctx.deadline)


async def start_cold_model(ctx: RequestContext) -> web.StreamResponse | None:
    """A model not loaded here (a memory budget): a peer that has it serves it, or it loads here first
    (a stream gets its headers and pings meanwhile), or 503 with Retry-After."""
    state, request = ctx.state, ctx.request
    if not ctx.forwarded and not ctx.is_batch and ctx.endpoint.spillable:
        spilled = await spill_cold_start(state, request, ctx.tenant, ctx.wire.model, ctx.prepared, ctx.body,
                                         ctx.deadline)
        if spilled is not None:
            return spilled
    if ctx.endpoint.generates:
        ctx.early = early_stream(state, request, ctx.request_id, ctx.prepared.stream)
    await wait_for_model(state, _model_field(ctx), ctx.deadline, ctx.early, ctx.tenant,
                         priority_class(state, ctx.tenant, ctx.is_batch))
    return None


def _model_field(ctx: RequestContext) -> str:
    """The model a forwarded request names: the version its origin routed it to."""
    pinned = ctx.request.headers.get(VERSION_HEADER) if ctx.forwarded else None
    return pinned or ctx.wire.model


async def route(ctx: RequestContext) -> None:
    """Aliases, splits, canaries and pins -> one loaded version (and LoRA adapter)."""
    ctx.route = route_request(ctx.state, _model_field(ctx), ctx.tenant, ctx.wire.user, ctx.request_id,
                              batch=ctx.is_batch)


async def check_circuit_breaker(ctx: RequestContext) -> None:
    """A version whose breaker is open: its fallback, or 503. A forwarded request keeps its origin's choice."""
    if not ctx.forwarded:
        ctx.route = check_breaker(ctx.state, ctx.route, ctx.tenant, ctx.wire.user, ctx.request_id)


async def degrade_under_overload(ctx: RequestContext) -> None:
    """Lower classes capped or sent to a smaller model while the version is overloaded."""
    if ctx.forwarded:
        return
    degraded = degrade(ctx.state, ctx.route, ctx.tenant, ctx.is_batch, ctx.wire.user, ctx.request_id)
    ctx.route, ctx.degraded, ctx.degraded_max_tokens = degraded.route, degraded.header, degraded.max_tokens


async def hold_version(ctx: RequestContext) -> None:
    """The routed version's engine, held until the request ends. Routing's stages never suspend, so a
    retire cannot slip between the route decision and this hold."""
    target = ctx.route.target
    ctx.model, ctx.engine = target.model, ctx.state.registry.table.engine(target)
    ctx.version_lease.hold(target)


async def check_permission(ctx: RequestContext) -> None:
    """403 unless the tenant may use the model (or the alias it asked for)."""
    ctx.allowed_model = check_model_allowed(ctx.state.tenancy, ctx.tenant, ctx.wire.model, ctx.model)


async def check_engine_healthy(ctx: RequestContext) -> None:
    if not ctx.engine.healthy:
        ctx.engine_failed = True        # the version's failure: its breaker counts it
        raise unavailable(f"The engine serving `{ctx.model}` is not available right now.", code="engine_unavailable")

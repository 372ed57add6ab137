"""POST /v1/embeddings: body -> inputs -> the embedding engine's batcher -> vectors.

The request path is the generation path's (completions.py), in the same order and with the same
refusals: authenticate, quota precheck, read and decode, deadline, Idempotency-Key, route (aliases,
splits, canaries, breakers), the tenant's model permission, a length bound per input before any
tokenization, tokenize (in the bounded pool when large), the tenant's content policy, charge the quota
once, then admission: each input is one request to the engine's weighted-fair queue (so tenants share
the batcher fairly and deadlines apply), but one HTTP request keeps at most a batch's worth of its
inputs queued at a time, so a 2,048-input request cannot fill the node's queue. The ledger row,
metrics, SLO outcome and log fields are written as for any request. Not here (yet): spillover to a
peer, the response cache, and embeddings as Batch API lines.
"""
from __future__ import annotations

import asyncio
import math
import secrets
import time

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api import idempotency
from inferd.api.admit import (SharedLease, charge, check_model_allowed, pace_refusals, precheck_quota,
                              refused_bytes, rejection_error, request_deadline)
from inferd.api.auth import authenticate
from inferd.api.body import check_json_content_type, read_body
from inferd.api.cold_start import wait_for_model
from inferd.api.completions import version_label
from inferd.api.context import GenerationContext
from inferd.api.embedding_format import check_dimensions, decode, inputs, prepared, response_body, truncate
from inferd.api.errors import CLIENT_GONE, ApiError, invalid, unavailable
from inferd.api.internal import batch_caller
from inferd.api.responses import abnormal_end, server_timing
from inferd.api.safety import check_input
from inferd.api.slo_outcomes import record_slo, record_slo_for
from inferd.api.tokenize import OFF_LOOP_BYTES, POOL, chars_per_token
from inferd.api.usage import check_ledger, record_usage
from inferd.api.versioned import check_breaker, record_outcome, route_request
from inferd.admission import AdmissionRejected
from inferd.config import PriorityClass
from inferd.engine import Engine, EngineUnavailable, InvalidRequest
from inferd.models import VersionLease
from inferd.tenancy import NO_TURN
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams, Usage

# Build the response body off the loop above this many floats (2,048 vectors of 4,096 floats take
# a third of a second to encode; every stream on the node would stall that long).
OFF_LOOP_FLOATS = 1 << 16


class _InputFailed(Exception):
    """One input ended without a vector (a deadline, an engine error): the request ends with it."""

    def __init__(self, final: Delta) -> None:
        super().__init__(final.finish_reason)
        self.final = final


async def create_embedding(request: web.Request) -> web.StreamResponse:
    state = request.app[keys.STATE]
    lease = VersionLease(state.versions)    # keeps the routed version loaded until this request ends
    response = None
    try:
        response = await _embed(request, state, lease)
        return response
    finally:
        lease.release()
        await idempotency.settle(request, state, response)


async def _embed(request: web.Request, state, lease: VersionLease) -> web.StreamResponse:
    model, engine, route, tenant = "other", None, None, ""
    turn, body = NO_TURN, b""
    try:
        if state.draining:
            raise unavailable("The server is draining; retry on another node.", code="draining")
        check_ledger(state)
        tenancy = state.tenancy
        batch = batch_caller(request, state.batch_secret)   # a batch line from our own runner
        tenant = batch[0] if batch is not None else authenticate(request, "inference").tenant
        precheck_quota(tenancy, tenant)
        if batch is None:
            turn = await pace_refusals(tenancy, tenant, request)    # a tenant sending invalid requests waits
        check_json_content_type(request)
        server = state.config.server
        body = await read_body(request, server.max_body_bytes)
        req = decode(body)
        items = inputs(req)
        deadline = request_deadline(request, req, tenancy, tenant, server, request[keys.ARRIVAL])
        replayed = await idempotency.claim(request, state, tenant, body, deadline)
        if replayed is not None:
            return replayed
        await wait_for_model(state, req.model, deadline, None)     # not loaded (issue 17): load, or 503
        route = route_request(state, req.model, tenant, req.user, request[keys.REQUEST_ID])
        route = check_breaker(state, route, tenant, req.user, request[keys.REQUEST_ID])
        model, engine = route.target.model, state.registry.table.engine(route.target)
        lease.hold(route.target)
        check_model_allowed(tenancy, tenant, req.model, model)
        if engine.info.task != "embed" or route.lora is not None:
            raise invalid(f"model: `{req.model}` is not an embedding model; /v1/embeddings needs one "
                          f"(see GET /v1/models).", param="model", code="model_not_embedding")
        if not engine.healthy:
            record_outcome(state, route.target, None, 503, None)
            raise unavailable(f"The engine serving `{model}` is not available right now.", code="engine_unavailable")
        width = check_dimensions(req.dimensions, engine.info.dimensions, engine.info.min_dimensions, req.model)
        try:        # the tenant's queue full: 429 now, before tokenizing what could not be queued
            tenancy.queue_for(model, engine).precheck(tenant, hold=_held_places(engine, len(items)))
        except AdmissionRejected as exc:
            raise rejection_error(exc, tenancy.quota.headers(tenant)) from None
        ids = await _tokenize(engine, items, len(body), deadline)
        _check_limits(tenancy, tenant, ids)
        text = prepared(items)
        await check_input(state, tenant, text, engine, model, request[keys.REQUEST_ID], deadline)
    except ApiError as err:
        state.metrics.count_rejected(model, err.status, engine)
        if route is not None:
            record_slo(state, route, tenant, err.status, batch=batch is not None)
        turn.refused(err.status, refused_bytes(request, err.status, body, state.config.server.max_body_bytes))
        raise
    except (asyncio.CancelledError, ConnectionError):     # its client left before the answer
        turn.refused(CLIENT_GONE, len(body))
        raise
    finally:
        turn.close()
    ctx = GenerationContext(request=request, state=state, tenant=tenant, prepared=text, route=route, model=model,
                            engine=engine, prompt_ids=ids, sampling=[SamplingParams(max_tokens=0)] * len(ids),
                            deadline=deadline, body=body, batch_id=batch[1] if batch is not None else None)
    with state.track():
        return await _run(ctx, req.encoding_format or "float", width)


async def _tokenize(engine: Engine, items: list[str | list[int]], body_bytes: int, deadline: float) -> list[list[int]]:
    """Token ids per input: each judged by its length first (no input longer than the context is ever
    tokenized), then encoded, in the bounded pool when the body is large."""
    limit, tok = engine.info.max_model_len, engine.tokenizer
    for i, x in enumerate(items):
        if len(x) <= limit:
            continue
        if isinstance(x, list):
            raise _too_long(i, f"{len(x)} tokens", limit)
        at_least = math.ceil(len(x) / await chars_per_token(tok, deadline))
        if at_least > limit:
            raise _too_long(i, f"{len(x)} characters, so at least {at_least} tokens", limit)

    def work() -> list[list[int]]:
        return [tok.encode(x) if isinstance(x, str) else x for x in items]

    ids = await POOL.run(work, deadline) if body_bytes > OFF_LOOP_BYTES else work()
    vocab = tok.vocab_size
    for i, row in enumerate(ids):
        if isinstance(items[i], list) and not all(0 <= t < vocab for t in row):
            raise invalid(f"input[{i}]: a token id is outside this model's vocabulary [0, {vocab}).",
                          param=f"input[{i}]", code="invalid_token_id")
        if len(row) > limit:
            raise _too_long(i, f"{len(row)} tokens", limit)
        if not row:
            raise invalid(f"input[{i}]: tokenizes to nothing.", param=f"input[{i}]", code="invalid_value")
    return ids


def _check_limits(tenancy, tenant: str, ids: list[list[int]]) -> None:
    """The tenant's per-request limits, as generation's `apply_limits`: max_prompt_tokens per input (each
    is a prompt), and a request whose tokens could never fit its tokens-per-minute bucket (a 429 would
    only make the client retry forever)."""
    cfg = tenancy.tenants.get(tenant)
    if cfg.max_prompt_tokens is not None:
        for i, row in enumerate(ids):
            if len(row) > cfg.max_prompt_tokens:
                tenancy.count_rejection(tenant, "limit")
                raise invalid(f"input[{i}]: {len(row)} tokens; this tenant's limit is {cfg.max_prompt_tokens}.",
                              param=f"input[{i}]", code="prompt_too_long")
    total = sum(map(len, ids))
    if cfg.tokens_per_minute is not None and total > cfg.tokens_per_minute:
        tenancy.count_rejection(tenant, "limit")
        raise invalid(f"input: {total} tokens in all exceeds this tenant's {cfg.tokens_per_minute} tokens per "
                      f"minute; split the request.", param="input", code="request_too_large")


def _too_long(i: int, size: str, limit: int) -> ApiError:
    return invalid(f"input[{i}]: {size}; this model's context is {limit} tokens.", param=f"input[{i}]",
                   code="context_length_exceeded")


async def _run(ctx: GenerationContext, encoding: str, width: int) -> web.StreamResponse:
    request, state, engine, route, model = ctx.request, ctx.state, ctx.engine, ctx.route, ctx.model
    label = version_label(engine)
    headers = {"X-Request-Id": ctx.request_id, "X-Inferd-Model-Version": label}
    if engine.info.simulated:
        headers["X-Inferd-Simulated"] = "true"
    obs = state.metrics.start_request(model, ctx.arrival, engine)
    eid = "emb-" + secrets.token_hex(12)       # the engine's request ids: ours, never the client's X-Request-Id
    gens = [GenerationRequest(request_id=f"{eid}-{i}", prompt_token_ids=tuple(ids), sampling=ctx.sampling[0],
                              tenant=ctx.tenant, deadline=ctx.deadline)
            for i, ids in enumerate(ctx.prompt_ids)]
    status, last, engine_down = CLIENT_GONE, None, False
    try:
        try:
            quota = charge(state.tenancy, ctx.tenant, gens)
            finals = await _admit_and_collect(state, ctx, gens, quota)
        except AdmissionRejected as exc:
            raise rejection_error(exc, state.tenancy.quota.headers(ctx.tenant)) from None
        except InvalidRequest as exc:
            raise invalid(str(exc), param=exc.param) from None
        except EngineUnavailable as exc:
            engine_down = True
            raise unavailable(f"The engine serving `{model}` is unavailable: {exc}", code="engine_unavailable") \
                from None
        except _InputFailed as exc:
            last = exc.final
            raise abnormal_end(last.finish_reason, last.error) from None
        last = Delta(token_ids=[], finish_reason=FinishReason.STOP, timing=finals[0].timing,
                     usage=Usage.summed([f.usage for f in finals if f.usage is not None]))

        def body() -> bytes:
            vectors = [truncate(f.embedding, width) for f in finals]
            return response_body(vectors, f"{model}@{label}", last.usage.prompt_tokens, encoding)

        data = await asyncio.to_thread(body) if len(finals) * width > OFF_LOOP_FLOATS else body()
        headers["Server-Timing"] = server_timing(ctx.arrival, last.timing, time.monotonic())
        headers.update(quota.headers)       # X-RateLimit-*
        status = 200
        await record_usage(ctx, status, last, 0, withhold=True)
        return web.Response(body=data, headers=headers, content_type="application/json")
    except ApiError as err:
        status = err.status
        raise
    finally:
        obs.finish(status, usage=last.usage if last is not None else None,
                   timing=last.timing if last is not None else None)
        if status != 200:
            await record_usage(ctx, status, last, 0)
        if last is not None or engine_down:     # what the version did; admission's refusals are no failure of it
            record_outcome(state, route.target, last, status, None)
        record_slo_for(ctx, status, obs=obs)
        request[keys.LOG_FIELDS].update(model=model, version=label, inputs=len(gens), outcome_status=status,
                                        prompt_tokens=last.usage.prompt_tokens if last and last.usage else 0)


def _held_places(engine: Engine, inputs: int) -> int:
    """Queue places a request of `inputs` inputs holds beside its first: those in flight with it."""
    return min(inputs, max(1, engine.info.max_batch_size)) - 1


async def _admit_and_collect(state, ctx: GenerationContext, gens: list[GenerationRequest], quota) -> list[Delta]:
    """Each input through the engine's admission queue, at most a batch's worth queued at once.

    The first input enters holding the places the others will take at once, and with their cost: the
    queue bounds and the early refusal judge the whole request, before anything is computed. The others
    follow it in (admission's `follow_up`), so a request let in is never refused partway for room, and
    only deadlines can end it early. The first failure withdraws the rest (an input that ends without a
    vector raises _InputFailed). Returns each input's final delta, in order."""
    try:
        queue = state.tenancy.queue_for(ctx.model, ctx.engine)
    except AdmissionRejected:
        quota.release(None)
        raise
    shares = SharedLease(quota, len(gens)).shares
    window = asyncio.Semaphore(max(1, ctx.engine.info.max_batch_size))
    tickets: list = [None] * len(gens)
    held = _held_places(ctx.engine, len(gens))
    priority = PriorityClass.BATCH if ctx.batch_id is not None else None     # Batch API lines: the batch class
    try:
        tickets[0] = queue.enter(gens[0], deadline=ctx.deadline, priority=priority, lease=shares[0], hold=held,
                                 rest_cost=queue.cost_of(gens[1:]))
    except BaseException:
        for share in shares[1:]:
            share.release(None)
        raise

    async def one(i: int) -> Delta:
        nonlocal held
        async with window:
            if tickets[i] is None:
                tickets[i] = queue.enter(gens[i], deadline=ctx.deadline, priority=priority, lease=shares[i],
                                         follow_up=True, from_hold=held > 0)
                held = max(0, held - 1)
            stream = await queue.admitted(tickets[i])
            try:
                final = await stream.collect()
            finally:
                stream.cancel()             # a no-op once finished; aborts when we are cancelled
            if final.finish_reason is not FinishReason.STOP:
                raise _InputFailed(final)   # the rest are withdrawn: the request has failed
            return final

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(gens))]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:                            # even if cancelled again while the inputs wind down
            for ticket in tickets:          # e.g. the first, if its task was cancelled before it ran
                if ticket is not None:
                    queue.withdraw(ticket)
            for share in shares:            # inputs that never entered give their share back
                share.release(None)
        raise
    finally:
        queue.release_hold(ctx.tenant, held)

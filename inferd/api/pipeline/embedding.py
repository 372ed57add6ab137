"""The stages of POST /v1/embeddings that differ from generation: its inputs, their token ids and the
tenant's limits on them, and admission of each input through the engine's weighted-fair queue.

Each input is one request to the engine's queue (so tenants share the batcher fairly and deadlines
apply), but one HTTP request keeps at most a batch's worth of its inputs queued at a time, so a
2,048-input request cannot fill the node's queue.
"""
from __future__ import annotations

import asyncio
import math
import secrets
import time

from aiohttp import web

from inferd.admission import AdmissionRejected
from inferd.api.pipeline.admit import charge, rejection_error
from inferd.api.wire.embedding_format import (
    check_dimensions,
    decode,
    inputs,
    prepared,
    response_body,
    truncate,
)
from inferd.api.errors import ApiError, invalid
from inferd.api.pipeline.admission import engine_refusal
from inferd.api.pipeline.context import CHARGED, RUNNING, RequestContext
from inferd.api.pipeline.embedding_admission import (
    InputFailed,
    admit_and_collect,
    held_places,
)
from inferd.api.pipeline.settle import record_usage_once
from inferd.api.wire.responses import abnormal_end
from inferd.api.pipeline.safety import check_input
from inferd.api.pipeline.prompt_tokens import OFF_LOOP_BYTES, POOL, chars_per_token
from inferd.engine import EngineUnavailable, InvalidRequest
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams, Usage

# Build the response body off the loop above this many floats (2,048 vectors of 4,096 floats take
# a third of a second to encode; every stream on the node would stall that long).
OFF_LOOP_FLOATS = 1 << 16


async def decode_inputs(ctx: RequestContext) -> None:
    ctx.wire = decode(ctx.body)
    ctx.extras["items"] = inputs(ctx.wire)


async def check_embedding_model(ctx: RequestContext) -> None:
    """An embedding model (no adapter), and the output width the client asked for."""
    engine = ctx.engine
    if engine.info.task != "embed" or ctx.route.lora is not None:
        raise invalid(f"model: `{ctx.wire.model}` is not an embedding model; /v1/embeddings needs one "
                      f"(see GET /v1/models).", param="model", code="model_not_embedding")


async def check_dimensions_asked(ctx: RequestContext) -> None:
    info = ctx.engine.info
    ctx.extras["width"] = check_dimensions(ctx.wire.dimensions, info.dimensions, info.min_dimensions, ctx.wire.model)


async def precheck_tenant_queue(ctx: RequestContext) -> None:
    """The tenant's queue full: 429 now, before tokenizing what could not be queued."""
    tenancy = ctx.state.tenancy
    try:
        tenancy.queue_for(ctx.model, ctx.engine).precheck(ctx.tenant, hold=held_places(ctx.engine,
                                                                                         len(ctx.extras["items"])))
    except AdmissionRejected as exc:
        raise rejection_error(exc, tenancy.quota.headers(ctx.tenant)) from None


async def tokenize_inputs(ctx: RequestContext) -> None:
    """Token ids per input: each judged by its length first (no input longer than the context is ever
    tokenized), then encoded, in the bounded pool when the body is large."""
    engine, items = ctx.engine, ctx.extras["items"]
    limit, tok = engine.info.max_model_len, engine.tokenizer
    for i, x in enumerate(items):
        if len(x) <= limit:
            continue
        if isinstance(x, list):
            raise _too_long(i, f"{len(x)} tokens", limit)
        at_least = math.ceil(len(x) / await chars_per_token(tok, ctx.deadline))
        if at_least > limit:
            raise _too_long(i, f"{len(x)} characters, so at least {at_least} tokens", limit)

    def work() -> list[list[int]]:
        return [tok.encode(x) if isinstance(x, str) else x for x in items]

    ids = await POOL.run(work, ctx.deadline) if len(ctx.body) > OFF_LOOP_BYTES else work()
    vocab = tok.vocab_size
    for i, row in enumerate(ids):
        if isinstance(items[i], list) and not all(0 <= t < vocab for t in row):
            raise invalid(f"input[{i}]: a token id is outside this model's vocabulary [0, {vocab}).",
                          param=f"input[{i}]", code="invalid_token_id")
        if len(row) > limit:
            raise _too_long(i, f"{len(row)} tokens", limit)
        if not row:
            raise invalid(f"input[{i}]: tokenizes to nothing.", param=f"input[{i}]", code="invalid_value")
    ctx.prompt_ids = ids
    ctx.sampling = [SamplingParams(max_tokens=0)] * len(ids)


async def check_tenant_limits(ctx: RequestContext) -> None:
    """The tenant's per-request limits, as generation's: max_prompt_tokens per input (each is a prompt),
    and a request whose tokens could never fit its tokens-per-minute bucket (a 429 would only make the
    client retry forever)."""
    tenancy, tenant, ids = ctx.state.tenancy, ctx.tenant, ctx.prompt_ids
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


async def check_content_policy(ctx: RequestContext) -> None:
    ctx.prepared = prepared(ctx.extras["items"])
    await check_input(ctx.state, ctx.tenant, ctx.prepared, ctx.engine, ctx.model, ctx.request_id, ctx.deadline)


def _too_long(i: int, size: str, limit: int) -> ApiError:
    return invalid(f"input[{i}]: {size}; this model's context is {limit} tokens.", param=f"input[{i}]",
                   code="context_length_exceeded")


async def embed(ctx: RequestContext) -> web.StreamResponse:
    """Charge the quota once, admit each input, and answer with their vectors."""
    state = ctx.state
    eid = "emb-" + secrets.token_hex(12)       # the engine's request ids: ours, never the client's X-Request-Id
    gens = [GenerationRequest(request_id=f"{eid}-{i}", prompt_token_ids=tuple(ids), sampling=ctx.sampling[0],
                              tenant=ctx.tenant, deadline=ctx.deadline)
            for i, ids in enumerate(ctx.prompt_ids)]
    ctx.log_fields.update(model=ctx.model, version=ctx.headers["X-Inferd-Model-Version"], inputs=len(gens))
    ctx.reached = CHARGED
    try:
        ctx.quota_lease = charge(state.tenancy, ctx.tenant, gens)
        finals = await admit_and_collect(state, ctx, gens, ctx.quota_lease)
    except AdmissionRejected as exc:
        raise rejection_error(exc, state.tenancy.quota.headers(ctx.tenant)) from None
    except (InvalidRequest, EngineUnavailable) as exc:
        raise engine_refusal(ctx, exc) from None
    except InputFailed as exc:
        ctx.last = exc.final
        raise abnormal_end(ctx.last.finish_reason, ctx.last.error) from None
    ctx.reached = RUNNING
    return await _respond(ctx, finals)


async def _respond(ctx: RequestContext, finals: list[Delta]) -> web.Response:
    last = ctx.last = Delta(token_ids=[], finish_reason=FinishReason.STOP, timing=finals[0].timing,
                            usage=Usage.summed([f.usage for f in finals if f.usage is not None]))
    width, label = ctx.extras["width"], ctx.headers["X-Inferd-Model-Version"]
    encoding = ctx.wire.encoding_format or "float"

    def body() -> bytes:
        vectors = [truncate(f.embedding, width) for f in finals]
        return response_body(vectors, f"{ctx.model}@{label}", last.usage.prompt_tokens, encoding)

    data = await asyncio.to_thread(body) if len(finals) * width > OFF_LOOP_FLOATS else body()
    ctx.headers["Server-Timing"] = ctx.timeline.server_timing(last.timing, time.monotonic())
    ctx.headers.update(ctx.quota_lease.headers)       # X-RateLimit-*
    ctx.status = 200
    await record_usage_once(ctx, last, ctx.status, withhold=True)
    return web.Response(body=data, headers=ctx.headers, content_type="application/json")

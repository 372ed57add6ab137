"""The stages of a completion or chat completion between routing and admission: what the body says,
whether this model can take it, and its token ids and sampling, judged cheapest first.
"""
from __future__ import annotations

import msgspec

from inferd.api.errors import invalid
from inferd.api.wire.openai import decode, prepare
from inferd.api.pipeline import sampling
from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.guided import compile_guided
from inferd.api.pipeline.safety import check_input
from inferd.api.pipeline.prompt_tokens import check_length_bound, tokenize


async def decode_body(ctx: RequestContext) -> None:
    """The body as a typed request (400 naming the field), and the semantic rules msgspec cannot express."""
    ctx.wire = decode(ctx.kind, ctx.body)
    ctx.prepared = prepare(ctx.kind, ctx.wire)
    max_n = ctx.state.config.server.max_n
    if ctx.prepared.n > max_n:
        raise invalid(f"n: at most {max_n} choices per request on this server, got {ctx.prepared.n}.", param="n",
                      code="invalid_value")


async def check_generative(ctx: RequestContext) -> None:
    if ctx.engine.info.task != "generate":
        raise invalid(f"model: `{ctx.wire.model}` is an embedding model; use /v1/embeddings.", param="model",
                      code="model_not_generative")


async def check_length_bound_of_prompts(ctx: RequestContext) -> None:
    """Every prompt judged from its length before any is tokenized: one too long for the context whatever
    it tokenizes to is a 400 without tokenizing anything."""
    for part in ctx.prepared.prompts():
        await check_length_bound(ctx.engine, part, ctx.engine.info.max_model_len, ctx.deadline)


async def tokenize_and_resolve_sampling(ctx: RequestContext) -> None:
    """logit_bias's token ids against the vocabulary, then each prompt's token ids (inline when short, the
    bounded pool when long) and its SamplingParams (inferd.api.pipeline.sampling), one prompt after the
    other: each prompt gives `n` choices, prompt-major (choice i*n + j is prompt i's j-th), each its own
    engine request with its own seed (Prepared.choice_seed). A prompt is tokenized once for its n choices."""
    model = ctx.state.config.models.get(ctx.model)
    limits = sampling.Limits(max_model_len=ctx.engine.info.max_model_len, tenancy=ctx.state.tenancy,
                             tenant=ctx.tenant, allowed_model=ctx.allowed_model,
                             degraded_max_tokens=ctx.degraded_max_tokens,
                             default_max_tokens=model.default_max_tokens if model is not None else None)
    sampling.check_logit_bias(ctx.prepared, ctx.engine.tokenizer.vocab_size)
    for part in ctx.prepared.prompts():
        ids = await tokenize(ctx.engine, part, len(ctx.body), ctx.deadline)
        params = sampling.resolve(part, len(ids), limits)
        for j in range(part.n):
            ctx.prompt_ids.append(ids)
            ctx.sampling.append(params if j == 0 else msgspec.structs.replace(params, seed=part.choice_seed(j)))


async def compile_grammar(ctx: RequestContext) -> None:
    """The output's grammar (response_format, vLLM's structured_outputs, tools), compiled off the loop before
    the request is charged or queued: one the engine cannot serve is a 400 naming the field that asked."""
    await compile_guided(ctx.engine, ctx.prepared, ctx.deadline)


async def check_content_policy(ctx: RequestContext) -> None:
    """The tenant's content policy on the input: after every cheap refusal and the tokenizer's checks."""
    ctx.policy = await check_input(ctx.state, ctx.tenant, ctx.prepared, ctx.engine, ctx.model, ctx.request_id,
                                   ctx.deadline)

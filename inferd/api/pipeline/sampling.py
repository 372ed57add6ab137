"""Sampling resolved once per choice: every rule that decides max_tokens, in one place, in order.

1. the client's max_tokens, or the endpoint's default (16 for completions as OpenAI; for chat and the
   Responses API the model's default_max_tokens, else the rest of the context);
2. the model's context: prompt + max_tokens must fit, and an explicit value that does not is a 400;
3. the tenant's caps (max_output_tokens, and what fits its tokens-per-minute bucket) when the client
   set none, then the tenant's limits (inferd.tenancy.quota.check_limits);
4. overload degradation's cap.
Errors name the field the client used: `prompt` / `max_tokens` for completions, `messages` /
`max_completion_tokens` for chat, `input` / `max_output_tokens` for the Responses API.
"""
from __future__ import annotations

from dataclasses import dataclass

from inferd.api.auth import PERMISSION
from inferd.api.errors import INVALID_REQUEST, ApiError, invalid
from inferd.api.wire.endpoints import ENDPOINTS
from inferd.api.wire.openai import Prepared
from inferd.tenancy import LimitExceeded, Tenancy
from inferd.types import SamplingParams


def charge_estimate(p: Prepared) -> int:
    """Output tokens to charge before the prompt is tokenized (a request served by a peer): the client's
    max_tokens per choice (n per prompt), or the endpoint's default (chat's, the context, is decided by the peer)."""
    per_choice = p.max_tokens or ENDPOINTS[p.kind].default_max_tokens or 0
    return per_choice * len(p.prompts()) * p.n


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds one request's output besides its prompt: the model, the tenant, degradation."""

    max_model_len: int
    tenancy: Tenancy
    tenant: str
    allowed_model: str              # the name the tenant's permission allowed (its per-model limits)
    degraded_max_tokens: int | None
    default_max_tokens: int | None = None    # the model's (models.X.default_max_tokens), for chat and responses


def check_logit_bias(p: Prepared, vocab_size: int) -> None:
    """logit_bias's token ids against the model's vocabulary, as the prompt's are: a 400 naming `logit_bias`."""
    for token, _ in p.logit_bias:
        if token >= vocab_size:
            raise invalid(f"logit_bias: token id {token} is outside this model's vocabulary [0, {vocab_size}).",
                          param="logit_bias", code="invalid_token_id")


def resolve(p: Prepared, prompt_len: int, limits: Limits) -> SamplingParams:
    """The SamplingParams of one choice of `p`, whose prompt is `prompt_len` tokens."""
    names = ENDPOINTS[p.kind]
    max_model_len = limits.max_model_len
    if prompt_len == 0:
        raise invalid(f"{names.prompt_field}: tokenizes to nothing.", param=names.prompt_field, code="empty_prompt")
    if prompt_len >= max_model_len:
        raise invalid(f"{names.prompt_field}: {prompt_len} tokens; this model's context is {max_model_len} tokens "
                      f"(prompt + completion).", param=names.prompt_field, code="context_length_exceeded")
    room = max_model_len - prompt_len
    max_tokens = p.max_tokens
    if max_tokens is None:
        default = names.default_max_tokens if names.default_max_tokens is not None else limits.default_max_tokens
        max_tokens = room if default is None else min(default, room)
    elif max_tokens > room:
        raise invalid(f"{names.max_tokens_field}: the prompt ({prompt_len} tokens) + {max_tokens} new tokens exceeds "
                      f"this model's context of {max_model_len} tokens; at most {room} are possible.",
                      param=names.max_tokens_field, code="context_length_exceeded")
    max_tokens = _tenant_limit(p, prompt_len, max_tokens, limits)
    if limits.degraded_max_tokens is not None:
        max_tokens = min(max_tokens, limits.degraded_max_tokens)
    return SamplingParams(max_tokens=max_tokens, temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                          stop=p.stop, ignore_eos=p.ignore_eos, top_k=p.top_k, min_p=p.min_p,
                          presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                          repetition_penalty=p.repetition_penalty, logit_bias=p.logit_bias,
                          logprobs=p.logprobs, prompt_logprobs=p.logprobs if p.echo else None,
                          guided=p.guided, speculative=p.speculative)


def _tenant_limit(p: Prepared, prompt_len: int, want: int, limits: Limits) -> int:
    """The tenant's per-request limits on top of the model's. A request that set no max_tokens gets
    the tenant's cap (and what fits its tokens-per-minute bucket) instead of a refusal."""
    tenancy, tenant = limits.tenancy, limits.tenant
    cfg = tenancy.tenants.get(tenant)
    if p.max_tokens is None:
        if cfg.max_output_tokens is not None:
            want = min(want, cfg.max_output_tokens)
        if cfg.tokens_per_minute is not None:
            want = min(want, max(1, cfg.tokens_per_minute - prompt_len))
    try:
        return tenancy.quota.check_limits(tenant, model=limits.allowed_model, prompt_tokens=prompt_len,
                                          max_tokens=want, context_len=limits.max_model_len)
    except LimitExceeded as exc:
        tenancy.count_rejection(tenant, "model_not_allowed" if exc.status == 403 else "limit")
        names = ENDPOINTS[p.kind]
        param = {"messages": names.prompt_field, "max_tokens": names.max_tokens_field}.get(exc.param, exc.param)
        raise ApiError(exc.status, f"{exc}.", type=PERMISSION if exc.status == 403 else INVALID_REQUEST,
                       param=param, code=exc.code) from None

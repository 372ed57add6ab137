"""What every backend shares about requests, so a client sees the same thing whatever serves it.

`validate_request` raises `InvalidRequest(message, param)` naming the field the client sent (the
API turns it into a 400). Checks that depend on an engine's state (a request id already in flight,
LoRA adapters it serves) stay in the engine.

`seed64` maps any integer seed onto the 64 bits every backend's generator takes: the API accepts
negative seeds (OpenAI's range is signed 64-bit), which a raw PCG64 or a uint64 field rejects.

`failure_message` is the Delta.error of a request the engine failed.

The ranges of the penalties, `min_p` and `logit_bias` are OpenAI's and vLLM's (the API states the
same ones); a `logit_bias` token id must lie in the engine's vocabulary, which only the engine knows.
"""
from __future__ import annotations

import math

from inferd.engine.base import InvalidRequest
from inferd.types import GenerationRequest, SamplingParams

SEED_MODULUS = 2 ** 64
PENALTY_RANGE = (-2.0, 2.0)         # presence_penalty, frequency_penalty (OpenAI's)
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's
MAX_LOGIT_BIAS = 300                # entries per request (OpenAI's limit)


def seed64(seed: int) -> int:
    """The request's seed as an unsigned 64-bit value: -1 and 2**64 - 1 draw the same tokens."""
    return seed % SEED_MODULUS


def failure_message(request_id: str) -> str:
    """What a client is told when the engine fails its request. Never the exception's text (it can
    name files, internals or another request's data): the engine logs that, with this request id."""
    return f"the engine failed this request; see server logs for request {request_id}"


MAX_LOGPROBS = 20      # alternatives per position: OpenAI's top_logprobs bound, the widest the API asks


def validate_request(request: GenerationRequest, *, vocab_size: int, max_model_len: int,
                     kv_capacity_tokens: int | None = None) -> None:
    """Raise InvalidRequest for a request no engine of this shape can run.

    `max_model_len` bounds prompt + max_tokens; `kv_capacity_tokens` (when the engine knows it) is
    what its whole KV pool holds, for engines whose max_model_len does not already account for it.
    """
    prompt, sp = request.prompt_token_ids, request.sampling
    if not prompt:
        raise InvalidRequest("the prompt is empty", "prompt")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise InvalidRequest(f"prompt token ids must lie in [0, {vocab_size})", "prompt")
    if not isinstance(sp.max_tokens, int) or sp.max_tokens < 1:
        raise InvalidRequest("max_tokens must be an integer >= 1", "max_tokens")
    if not (isinstance(sp.temperature, (int, float)) and math.isfinite(sp.temperature) and sp.temperature >= 0):
        raise InvalidRequest("temperature must be a finite number >= 0", "temperature")
    if not (isinstance(sp.top_p, (int, float)) and 0 < sp.top_p <= 1):
        raise InvalidRequest("top_p must be in (0, 1]", "top_p")
    if not isinstance(sp.top_k, int) or sp.top_k < 0:
        raise InvalidRequest("top_k must be an integer >= 0 (0 = no top-k filter)", "top_k")
    _validate_logit_processing(sp, vocab_size)
    if sp.seed is not None and (not isinstance(sp.seed, int) or isinstance(sp.seed, bool)):
        raise InvalidRequest("seed must be an integer", "seed")
    if any(not isinstance(s, str) or not s for s in sp.stop):
        raise InvalidRequest("stop strings must be non-empty", "stop")
    if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in sp.stop_token_ids):
        raise InvalidRequest(f"stop_token_ids must lie in [0, {vocab_size})", "stop_token_ids")
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(sp, name)
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_LOGPROBS):
            raise InvalidRequest(f"{name} must be null or an integer in [0, {MAX_LOGPROBS}]", "logprobs")
    total = len(prompt) + sp.max_tokens
    if total > max_model_len:
        # A prompt that fills the context alone is the prompt's fault, whatever max_tokens says.
        param = "prompt" if len(prompt) >= max_model_len else "max_tokens"
        raise InvalidRequest(f"this model's maximum context length is {max_model_len} tokens; the request "
                             f"needs {total} ({len(prompt)} prompt + {sp.max_tokens} max_tokens)", param)
    if kv_capacity_tokens is not None and total > kv_capacity_tokens:
        raise InvalidRequest(f"this engine's KV cache holds {kv_capacity_tokens} tokens; the request needs "
                             f"{total} ({len(prompt)} prompt + {sp.max_tokens} max_tokens)", "max_tokens")


def _number_in(value: object, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and low <= value <= high


def _validate_logit_processing(sp: SamplingParams, vocab_size: int) -> None:
    """The penalties, min_p and logit_bias: in range, and logit_bias's token ids in the vocabulary."""
    for name in ("presence_penalty", "frequency_penalty"):
        if not _number_in(getattr(sp, name), *PENALTY_RANGE):
            raise InvalidRequest(f"{name} must be in [{PENALTY_RANGE[0]:g}, {PENALTY_RANGE[1]:g}]", name)
    if not (_number_in(sp.repetition_penalty, 0.0, math.inf) and sp.repetition_penalty > 0):
        raise InvalidRequest("repetition_penalty must be a finite number > 0 (1 = none)", "repetition_penalty")
    if not _number_in(sp.min_p, 0.0, 1.0):
        raise InvalidRequest("min_p must be in [0, 1]", "min_p")
    if len(sp.logit_bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"logit_bias takes at most {MAX_LOGIT_BIAS} token ids, got {len(sp.logit_bias)}",
                             "logit_bias")
    low, high = LOGIT_BIAS_RANGE
    for token, bias in sp.logit_bias:
        if not isinstance(token, int) or not 0 <= token < vocab_size:
            raise InvalidRequest(f"logit_bias: token id {token} is not in this model's vocabulary "
                                 f"[0, {vocab_size})", "logit_bias")
        if not _number_in(bias, low, high):
            raise InvalidRequest(f"logit_bias: the bias of token {token} must be in [{low:g}, {high:g}]",
                                 "logit_bias")

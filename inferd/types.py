"""The plain structs that cross seams: API -> admission -> engine -> API.

Everything here is data. Policy lives in the modules that consume it.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Literal

import msgspec


class FinishReason(str, enum.Enum):
    """Why a generation ended. The API maps these onto OpenAI's `finish_reason`."""

    STOP = "stop"          # EOS, a stop token id or a stop string
    LENGTH = "length"      # max_tokens or the model's context was reached
    ABORT = "abort"        # aborted by us: client gone, drain, admin
    DEADLINE = "deadline"  # the request's deadline passed while it was generating
    ERROR = "error"        # the engine failed this request (Delta.error says why)
    CONTENT_FILTER = "content_filter"   # the tenant's safety policy stopped its output (inferd.safety)


class GuidedDecoding(msgspec.Struct, frozen=True, kw_only=True):
    """A grammar the output must follow, as plain data: the engine compiles it with xgrammar
    (inferd.engine.grammar), cached per (tokenizer, GuidedDecoding).

    kind           spec
    json_schema    the JSON schema, as compact JSON text in the client's key order (the output's keys follow
                   the order of `properties`, as OpenAI's do; the same schema sent again is the same entry)
    json_object    "" (any JSON object)
    regex          the regular expression
    choice         a JSON list of the allowed strings
    grammar        an EBNF grammar (GBNF/xgrammar syntax, with a `root` rule)
    """

    kind: Literal["json_schema", "json_object", "regex", "choice", "grammar"]
    spec: str = ""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Per-request sampling. temperature == 0 means greedy.

    The penalties, `logit_bias` and `min_p` mean what vLLM's sampler makes of them (see
    inferd.engine.reference.sampler); their defaults change nothing.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 = no top-k filter
    seed: int | None = None             # same seed -> same output, whatever else is batched
    stop: tuple[str, ...] = ()          # stop strings: text ends before them, never streamed
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0       # subtracted once from each token already in the output
    frequency_penalty: float = 0.0      # subtracted per occurrence in the output
    repetition_penalty: float = 1.0     # prompt and output tokens: positive logits / it, negative ones * it
    min_p: float = 0.0                  # drop tokens less likely than min_p x the most likely one
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias added to its logit), by token id
    # As vLLM's SamplingParams: None = no log-probabilities; k >= 0 = each generated token's own
    # log-probability and its k most likely alternatives. Raw values: log_softmax of the model's
    # logits before temperature, penalties or filters (vLLM's default `raw_logprobs`).
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for every prompt token after the first (echo)
    guided: GuidedDecoding | None = None    # the output follows this grammar (None: free text)
    # May the engine draft tokens for this request and verify them in one step (a model's [speculative]
    # table)? False: one token per step, as without speculation. Either way the output's distribution is
    # the model's (greedy output is the same token for token).
    speculative: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalties or a bias change the logits before any choice (greedy ones included)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What admission hands an engine."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    tenant: str = "local"               # salts the prefix cache: tenants never share KV blocks
    lora: str | None = None             # adapter name (backends that support LoRA)
    # time.monotonic() by which the answer is due (None: none). Admission enforces it on every engine;
    # the unary batcher (inferd.engine.unary) also closes batches and drops hopeless work by it.
    deadline: float | None = None
    # The tenant's weight ([tenants.<name>] weight), set by admission: an engine that must preempt for KV
    # blocks takes from the tenant holding the most blocks per unit of weight (inferd.engine.victims).
    weight: float = 1.0


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0              # prompt tokens served from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def summed(cls, usages: Sequence[Usage]) -> Usage | None:
        """The usage of several requests answered as one (None for none)."""
        if not usages:
            return None
        return cls(prompt_tokens=sum(u.prompt_tokens for u in usages),
                   completion_tokens=sum(u.completion_tokens for u in usages),
                   cached_tokens=sum(u.cached_tokens for u in usages))


class EngineTiming(msgspec.Struct, frozen=True, kw_only=True):
    """time.monotonic() stamps taken by the engine for one request (None = never happened)."""

    submitted: float
    first_scheduled: float | None = None   # first prefill chunk ran
    first_token: float | None = None       # first output token was produced
    finished: float | None = None


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One position's raw log-probabilities: the token there, its logprob, and the k most likely
    tokens at that position as (token id, logprob), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Delta(msgspec.Struct, kw_only=True):
    """A piece of one request's output stream.

    The last delta of a stream has `finish_reason` set and carries `usage` and `timing`.
    Consecutive deltas may be merged (see engine.stream.RequestStream): token ids and text
    concatenate; the final fields come from the last one.
    """

    token_ids: list[int]
    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timing: EngineTiming | None = None
    error: str | None = None            # set with FinishReason.ERROR: a message safe for clients
    embedding: Any = None               # embedding engines' final delta: the input's vector (numpy float32)
    # Requests with SamplingParams.logprobs: one entry per token id of this delta, in order.
    logprobs: list[TokenLogprob] | None = None
    # Requests with SamplingParams.prompt_logprobs: every prompt token's (None for the first, which
    # has no context), on the stream's first delta that carries any.
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class ModelVersion(msgspec.Struct, frozen=True, order=True):
    """One loaded engine version: served model name + content-addressed artifact version id."""

    model: str
    version: str

    def __str__(self) -> str:
        return f"{self.model}@{self.version}"

    @classmethod
    def parse(cls, text: str) -> ModelVersion:
        model, sep, version = text.partition("@")
        if not sep or not model or not version or "@" in version:
            raise ValueError(f"expected 'model@version', got {text!r}")
        return cls(model, version)

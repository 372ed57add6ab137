"""The Engine interface every backend implements, and the structs at that seam.

Admission decides *who* runs next; an engine decides only how to batch what it was given.
It therefore exposes `capacity()` so admission can release work only while there is room,
keeping the engine's own waiting queue near empty.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from inferd.engine.stream import RequestStream
from inferd.types import GenerationRequest

if TYPE_CHECKING:
    from inferd.engine.grammar import Grammars


class EngineError(Exception):
    """Base class for errors an engine raises at submit time."""


class EngineUnavailable(EngineError):
    """The engine is not healthy (failed, shutting down, not started). The API answers 503."""


class InvalidRequest(EngineError):
    """The request cannot run on this engine (e.g. prompt + max_tokens beyond the context).

    `param` names the offending field for the OpenAI error envelope.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@runtime_checkable
class Tokenizer(Protocol):
    """What the API and the engines need of a tokenizer (see inferd.engine.tokenization)."""

    eos_token_ids: tuple[int, ...]
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            **extra: Any) -> str: ...


class EngineInfo(msgspec.Struct, frozen=True, kw_only=True):
    backend: str                 # "reference" | "sim" | "trtllm"
    model_name: str              # artifact name, e.g. "small"
    version: str                 # content-addressed artifact version id
    max_model_len: int           # prompt + output tokens per sequence
    block_size: int              # tokens per KV block
    num_kv_blocks: int
    max_batch_size: int          # sequence slots
    max_num_tokens: int          # per-step token budget
    simulated: bool = False      # True only for the sim backend; surfaced in responses and labels
    prefix_caching: bool = False  # a repeated prompt reuses whole KV blocks (Usage.cached_tokens > 0)
    # What it runs on, as the `hardware` label of the autoscaling gauges: a sim profile's name (GPU and
    # model), "cpu" for the reference engine, "gpu" for TensorRT-LLM (one engine per GPU group).
    hardware: str = "unknown"
    # What it serves: "generate" (completions, chat) or "embed" (/v1/embeddings, inferd.engine.unary).
    task: str = "generate"
    dimensions: int = 0                   # embed: the native vector width
    min_dimensions: int | None = None     # embed: truncation (Matryoshka) allowed down to this; None: not at all
    # How the model writes tool calls ("hermes" | "llama3_json"), from its artifact's manifest: what
    # tool_choice "auto" parses (inferd.api.wire.tool_calls). The sim's ChatML template is Hermes'.
    tool_call_format: str = "hermes"
    # The weights as served: "float32", "bfloat16", "float16", "int8" (weight-only), or a sim profile's
    # precision ("bf16", "fp8", ...): what a precision tier routes to (docs/models.md).
    precision: str = ""


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    """Room for new work right now, as admission sees it."""

    free_kv_blocks: int
    free_kv_tokens: int          # free_kv_blocks * block_size
    free_slots: int              # max_batch_size - (running + waiting); parked sequences not counted
    waiting: int                 # requests inside the engine not yet scheduled
    block_size: int
    # Prompt tokens submitted but not yet computed (queued + partially prefilled). Admission uses it
    # to keep one tenant's prefills from filling every step a newcomer's prefill would share.
    pending_prefill_tokens: int = 0
    # Sequences that yielded their slot (Engine.yield_slot) and resume once one is free and nothing newer
    # waits, and the KV blocks they will need then. free_slots and free_kv_blocks leave them out, so the
    # tenant a slot was yielded for can take it; anyone else should leave them for the parked ones.
    parked: int = 0
    parked_kv_blocks: int = 0


def blocks_for(num_tokens: int, block_size: int) -> int:
    """KV blocks that hold num_tokens (a partly filled last block is a whole block)."""
    return -(-num_tokens // block_size)


class SpeculationStats(msgspec.Struct, frozen=True, kw_only=True):
    """Speculative decoding since start: draft tokens verified, those the model kept, and the verifications
    (one sequence's step with a draft, which yields its kept drafts and one token of the model's own)."""

    draft_tokens: int
    accepted_tokens: int
    verifications: int


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    prefix_cache_hit_rate: float       # cached prompt tokens / prompt tokens, since start
    step_latency_s: float              # last (or moving-average) step wall time
    steps_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    prefix_cache_hit_tokens_total: int
    tokens_per_s: float                # moving average of tokens processed per second (prefill + decode)
    fairness_preemptions_total: int = 0    # sequences that yielded their slot to another tenant (yield_slot)
    speculation: SpeculationStats | None = None     # None: the engine does not speculate
    # Host CPU its step loop used since start (the sim's turns on the event loop, a step engine's thread);
    # None: the engine does not say (trtllm's executor threads are its own).
    step_cpu_seconds_total: float | None = None


class Engine(abc.ABC):
    """One loaded model version. All methods are called on the event-loop thread.

    `step_observer`, when set (the daemon sets it to feed inferd_engine_step_seconds), is called once
    per engine step with that step's duration in seconds: wall time for the reference engine, simulated
    time for the sim (as its stats), the executor's iteration latency for trtllm. It may be called from
    an engine's own thread, so it must be thread-safe (Prometheus histograms are) and quick; engines log
    an exception from it and carry on.

    `grammars`, when set, compiles a request's grammar (the API does it off the loop before submit, so
    a refusal is a 400); the engine masks that request's logits by it.
    """

    info: EngineInfo
    tokenizer: Tokenizer
    step_observer: Callable[[float], None] | None = None
    # This engine's compiled grammars (inferd.engine.grammar), for requests with SamplingParams.guided;
    # None: it cannot constrain its output (the API answers 400 naming the field that asked).
    grammars: Grammars | None = None
    # True: a request whose grammar `grammars` has not compiled may still be submitted: the engine compiles
    # it off its step (inferd.engine.grammar_worker). False (trtllm): it refuses such a request.
    compiles_missed_grammars: bool = False
    # True: yield_slot works (the engine can preempt a running sequence and recompute it later). False
    # (trtllm: the executor cannot): admission keeps a reserve of slots instead (inferd.admission.gate).
    yields_slots: bool = False

    @abc.abstractmethod
    async def start(self) -> None:
        """Acquire resources (threads, executors). Blocking loads happen off the loop."""

    @abc.abstractmethod
    async def warmup(self) -> None:
        """Run representative prompt and decode shapes so the first request is not slow."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Abort everything in flight (each stream ends with FinishReason.ABORT) and release resources."""

    @abc.abstractmethod
    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a request and return its delta stream. Never blocks.

        Raises InvalidRequest for requests this engine cannot run, EngineUnavailable when unhealthy.
        A request id must be unique among requests in flight.
        """

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Stop a request; its KV blocks are free within one engine step. Unknown ids are ignored.

        The stream ends with a final delta whose finish_reason is ABORT.
        """

    def yield_slot(self, request_id: str) -> bool:
        """Admission asks a running (or engine-waiting) request to give its sequence slot to another
        tenant's: the sequence is preempted (its KV blocks freed) and parked; it is recomputed from its
        tokens so far and resumes, once a slot is free and no newer submitted request waits, with nothing
        lost (its stream only pauses). capacity() counts the slot free at once, the sequence as parked.
        False (nothing done) for an unknown, finished or already parked request, or when `yields_slots`
        is False."""
        return False

    @abc.abstractmethod
    def capacity(self) -> Capacity: ...

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    @property
    def healthy(self) -> bool:
        return True

"""One request's state inside an engine that uses the shared scheduler: its tokens, its KV blocks, its progress.

Plain data, no model and no threads: the block manager and scheduler move these around and
are tested with hand-made sequences of integers.
"""
from __future__ import annotations

import enum
import hashlib
from typing import Any

import numpy as np

from inferd.types import FinishReason, SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"      # not holding KV blocks (new, or preempted and waiting to recompute)
    RUNNING = "running"      # holds blocks; prefilling in chunks or decoding
    FINISHED = "finished"


def prefix_salt(tenant: str, lora: str | None = None) -> bytes:
    """The seed of a sequence's block-hash chain: tenants (and adapters) never share KV blocks."""
    return hashlib.blake2b(f"{tenant}\x00{lora or ''}".encode(), digest_size=16).digest()


class Sequence:
    """Token ids (prompt, then generated) and where their K/V lives.

    `num_computed_tokens` counts tokens whose K/V is in the cache. A decoding sequence has
    exactly one token not yet computed: the one sampled last step.
    """

    __slots__ = (
        "request_id", "token_ids", "num_prompt_tokens", "sampling", "salt", "arrival",
        "status", "block_table", "num_computed_tokens", "num_cached_tokens", "block_hashes",
        "num_registered_blocks", "finish_reason", "admitted", "rng", "engine_state", "lora_name", "lora",
        "prompt_key", "needs_prompt_logits", "grammar", "tenant", "weight", "draft", "draft_kv_len", "token_array",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int] | tuple[int, ...],
                 sampling: SamplingParams | None = None, *, salt: bytes = b"", arrival: int = 0,
                 lora: str | None = None, tenant: str = "", weight: float = 1.0) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.sampling = sampling if sampling is not None else SamplingParams()
        # Prompt log-probabilities need the logits at every prompt position: such a prompt is computed
        # whole, never taken from the prefix cache or forked from another's (as vLLM v1).
        self.needs_prompt_logits = self.sampling.prompt_logprobs is not None
        self.salt = salt
        self.arrival = arrival                  # submission order: the scheduler's FCFS key
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0              # prompt tokens served from the prefix cache (first admission)
        self.block_hashes: list[bytes] = []     # chained hashes of full blocks of token_ids, extended lazily
        self.num_registered_blocks = 0          # leading blocks of block_table already offered to the cache
        self.finish_reason: FinishReason | None = None
        self.admitted = False                   # scheduled at least once (cached-token accounting)
        self.rng: np.random.Generator | None = None
        self.engine_state: Any = None           # the engine's per-request output state (stream, detokenizer)
        self.lora_name = lora                   # the LoRA adapter the request names
        self.lora: Any = None                   # the adapter it holds, pinned while held (reference: LoraWeights)
        self.prompt_key: bytes | None = None    # salt + prompt digest: identical prompts fork (Scheduler)
        # A GrammarState (inferd.engine.grammar) when sampling.guided is set: the engine masks this sequence's
        # logits by it and feeds it each sampled token once (a recompute after preemption samples none of
        # the old ones again, so the matcher never sees a token twice); it ending ends the sequence.
        self.grammar: Any = None
        # Whose it is, and that tenant's weight: KV preemption takes from the tenant holding the most
        # blocks per unit of weight (inferd.engine.victims).
        self.tenant = tenant
        self.weight = weight
        # Tokens a drafter guessed follow token_ids (inferd.engine.speculative): the next step computes
        # them with the last token and keeps those the model agrees with. Empty: one token per step.
        self.draft: list[int] = []
        self.draft_kv_len = 0                   # tokens a draft model has K/V for (speculative.draft_model)
        self.token_array: Any = None            # token_ids as a growing int64 array (speculative.ngram)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def full_block_hashes(self, block_size: int) -> list[bytes]:
        """Chained hashes of every full block of the current tokens (salt enters the first one)."""
        hashes = self.block_hashes
        num_full = len(self.token_ids) // block_size
        if len(hashes) < num_full:
            prev = hashes[-1] if hashes else self.salt
            tokens = np.asarray(self.token_ids[len(hashes) * block_size:num_full * block_size], dtype=np.int64)
            for chunk in tokens.reshape(-1, block_size):
                prev = hashlib.blake2b(prev + chunk.tobytes(), digest_size=16).digest()
                hashes.append(prev)
        return hashes

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
                f"blocks={self.block_table}, {self.status.value})")

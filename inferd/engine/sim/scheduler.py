"""The sim's view of the shared scheduler: its sequences, each step's sizes for the roofline, its capacity.

Scheduling is the engine's own (inferd.engine.scheduler over inferd.engine.block_manager): running
sequences first (oldest first) under one token budget shared by decodes and chunked prefills, then FCFS
from waiting within `max_batch_size` slots; KV blocks are allocated as contexts grow (a waiting sequence
is admitted when its step's chunk fits), and when they run out the newest running sequence is preempted
(its KV dropped, to be recomputed from the head of the waiting queue). The sim has no KV contents, so
no prefix cache and no packed model inputs.

No time, no tokens, no event loop: SimEngine (the simulated executor) asks for each step's work
(`schedule`), reports what the step computed (`computed`), and releases sequences that end (`remove`).
"""
from __future__ import annotations

import codecs
import time
from collections.abc import Iterable

from inferd.engine.base import Capacity, blocks_for
from inferd.engine.block_manager import BlockManager
from inferd.engine.scheduler import Scheduler, SchedulerOutput
from inferd.engine.sequence import Sequence, SequenceStatus
from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import StopMatcher
from inferd.types import FinishReason


class SimSequence(Sequence):
    """One request inside the sim: the shared scheduler's sequence, plus what the engine needs to emit tokens."""

    __slots__ = ("stream", "max_tokens", "key", "stop_ids", "eos_threshold", "matcher", "submitted",
                 "first_scheduled", "first_token", "done", "logprobs", "prompt_logprobs", "utf8",
                 "plain")

    def __init__(self, request_id: str, stream: RequestStream, prompt_token_ids: list[int] | tuple[int, ...],
                 max_tokens: int, key: int, stop_ids: frozenset[int], eos_threshold: int,
                 matcher: StopMatcher | None) -> None:
        super().__init__(request_id, prompt_token_ids)
        self.stream = stream
        self.max_tokens = max_tokens
        self.key = key                 # what generated tokens are a function of, with their position
        self.stop_ids = stop_ids
        self.eos_threshold = eos_threshold
        self.matcher = matcher
        self.submitted = time.monotonic()
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.done = False              # its stream has ended
        self.logprobs: int | None = None           # synthetic log-probabilities (sim.logprobs), as asked
        self.prompt_logprobs: int | None = None    # and for the prompt, on the first delta (then None)
        # Raw byte tokens decoded across steps: a grammar asking for non-ASCII text (a schema's "naïve" key,
        # a choice "café") makes it emit a character's UTF-8 bytes one token each (see SimEngine._text).
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.plain = False             # no grammar, stop strings or log-probabilities (SimEngine._add)
        # self.lora: the name of the LoRA adapter it runs with (its cost: sim.lora)

    @property
    def prompt_len(self) -> int:
        return self.num_prompt_tokens

    @property
    def output(self) -> list[int]:
        """The tokens generated so far (a copy: the engine appends to token_ids)."""
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_computed(self) -> int:
        """Tokens whose KV exists (0 again after a preemption: recompute)."""
        return self.num_computed_tokens

    @property
    def blocks(self) -> int:
        """KV blocks held."""
        return len(self.block_table)


class StepPlan:
    """One step's work: (sequence, tokens to compute) pairs and the sizes the roofline prices."""

    __slots__ = ("output", "scheduled", "num_tokens", "kv_tokens", "pairs")

    def __init__(self, output: SchedulerOutput, now: float) -> None:
        """The sizes of `output`, just scheduled; sequences scheduled for the first time are stamped `now`."""
        self.output = output
        pairs_of = zip(output.seqs, output.num_new_tokens)
        self.scheduled: list[tuple[SimSequence, int]] = list(pairs_of)  # type: ignore[arg-type]
        for seq in output.seqs[output.first_admitted:]:     # only a sequence just admitted can be new
            if seq.first_scheduled is None:
                seq.first_scheduled = now
        self.num_tokens = sum(output.num_new_tokens)   # tokens computed this step (prefill + decode)
        self.kv_tokens = output.kv_tokens               # KV entries read
        self.pairs = output.attention_pairs             # (query, key) attention pairs


class SimScheduler:
    def __init__(self, *, num_kv_blocks: int, block_size: int, max_batch_size: int, max_num_tokens: int) -> None:
        self.num_kv_blocks, self.block_size = num_kv_blocks, block_size
        self.max_batch_size, self.max_num_tokens = max_batch_size, max_num_tokens
        self.block_manager = BlockManager(num_kv_blocks, block_size, prefix_caching=False)
        # max_model_len: the sim ends sequences itself (max_tokens, stop ids); validation bounds contexts
        self._scheduler = Scheduler(self.block_manager, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                                    max_model_len=num_kv_blocks * block_size, reserve_whole_prompt=False,
                                    pack_inputs=False)
        self.running: list[SimSequence] = self._scheduler.running      # type: ignore[assignment]
        self.waiting = self._scheduler.waiting
        self._capacity: Capacity | None = None   # cached until the next change
        # What the running sequences hold back, (blocks their prompts still need, prefill tokens left): read
        # once per step, not on every change, as a decode step leaves it as it was and so does a sequence that
        # ends while decoding (nearly every removal). Summing it on each change cost a pass over every running
        # sequence per request admitted or ended: at 2,048 streams, the largest cost that grew with them.
        self._running_part: tuple[int, int] | None = None

    @property
    def free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def preemptions(self) -> int:
        return self._scheduler.num_preemptions

    @property
    def parked(self) -> int:
        return len(self._scheduler.parked)

    @property
    def fairness_preemptions(self) -> int:
        return self._scheduler.num_parked

    def has_work(self) -> bool:
        return self._scheduler.has_work()

    def park(self, seq: SimSequence) -> bool:
        """Give `seq`'s slot up now, even mid-step: the sim's step in flight reads no KV, and what it
        computed for `seq` is dropped (Scheduler.advance skips it; its token is made again on resume)."""
        parked = self._scheduler.park(seq)
        self._capacity = self._running_part = None
        return parked

    def add(self, seq: SimSequence) -> None:
        self._scheduler.add(seq)
        self._capacity = None

    def remove(self, seq: SimSequence, reason: FinishReason = FinishReason.ABORT) -> None:
        """Release the sequence's slot and blocks now (it finished or was aborted)."""
        if seq.status is SequenceStatus.RUNNING and held_back((seq,), self.block_size) != (0, 0):
            self._running_part = None
        self._scheduler.finish(seq, reason)
        self._capacity = None

    def computed(self, plan: StepPlan) -> None:
        """The step ran: its sequences (those not removed meanwhile) have their tokens' KV."""
        self._scheduler.advance(plan.output)
        self._capacity = self._running_part = None

    def capacity(self) -> Capacity:
        cap = self._capacity
        if cap is None:
            # Never over-report: blocks that waiting and still-prefilling sequences will need are taken.
            # Pending prefill: every waiting context (new or preempted, num_computed 0), and what running
            # sequences still have to compute beyond a decode's single token (chunked or recomputing).
            bs = self.block_size
            part = self._running_part
            if part is None:
                part = self._running_part = held_back(self.running, bs)
            reserved, pending = part
            for s in self.waiting:
                context = s.num_tokens
                reserved += blocks_for(context, bs)
                pending += context - s.num_computed_tokens
            free = max(0, self.free_blocks - reserved)
            parked = self._scheduler.parked
            cap = self._capacity = Capacity(
                free_kv_blocks=free, free_kv_tokens=free * bs, waiting=len(self.waiting), block_size=bs,
                free_slots=max(0, self.max_batch_size - len(self.running) - len(self.waiting)),
                pending_prefill_tokens=pending, parked=len(parked),
                parked_kv_blocks=sum(blocks_for(s.num_tokens, bs) for s in parked))
        return cap

    def schedule(self) -> StepPlan:
        """Pick this step's work: running sequences first (oldest first), then FCFS from waiting."""
        plan = StepPlan(self._scheduler.schedule(), time.monotonic())
        self._capacity = self._running_part = None
        return plan


def held_back(running: Iterable[SimSequence], block_size: int) -> tuple[int, int]:
    """What running sequences hold back beyond the blocks they have: (blocks their prompts still need, prefill
    tokens still to compute: a chunked or recomputing prefill, or a prompt computed but not yet given its first
    token). A decoding sequence holds back nothing, before or after its step's token is appended."""
    reserved = pending = 0
    for s in running:
        left = s.num_tokens - s.num_computed_tokens
        if left > 1 or s.num_tokens == s.num_prompt_tokens:
            pending += left
        if s.num_computed_tokens < s.num_prompt_tokens:
            reserved += blocks_for(s.num_prompt_tokens, block_size) - len(s.block_table)
    return reserved, pending

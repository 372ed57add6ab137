"""The sim's scheduling bookkeeping: FCFS waiting queue, running batch, KV blocks, preemption.

No time, no tokens, no event loop: SimEngine asks for each step's work (`schedule`), reports what
the step computed (`computed`), and releases sequences that end (`remove`). Scheduling is a real
engine's: running sequences first (oldest first) under one token budget shared by decodes and
chunked prefills, then FCFS from waiting within `max_batch_size` slots; KV blocks are allocated as
contexts grow, and when they run out the newest running sequence is preempted (its KV dropped, to
be recomputed from the head of the waiting queue).
"""
from __future__ import annotations

import collections
import time

from inferd.engine.base import Capacity, blocks_for
from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import StopMatcher


class SimSequence:
    """One request inside the sim: its scheduling state, plus what the engine needs to emit tokens."""

    __slots__ = ("request_id", "stream", "prompt_len", "output", "num_computed", "blocks", "max_tokens",
                 "key", "stop_ids", "eos_threshold", "matcher", "submitted", "first_scheduled",
                 "first_token", "done", "lora")

    def __init__(self, request_id: str, stream: RequestStream, prompt_len: int, max_tokens: int, key: int,
                 stop_ids: frozenset[int], eos_threshold: int, matcher: StopMatcher | None) -> None:
        self.request_id = request_id
        self.stream = stream
        self.prompt_len = prompt_len
        self.output: list[int] = []
        self.num_computed = 0          # tokens whose KV exists (reset to 0 by preemption: recompute)
        self.blocks = 0                # KV blocks held
        self.max_tokens = max_tokens
        self.key = key                 # what generated tokens are a function of, with their position
        self.stop_ids = stop_ids
        self.eos_threshold = eos_threshold
        self.matcher = matcher
        self.submitted = time.monotonic()
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.done = False
        self.lora: str | None = None   # the LoRA adapter it runs with (its cost: sim.lora)


class StepPlan:
    """One step's work: (sequence, tokens to compute) pairs and the sizes the roofline prices."""

    __slots__ = ("scheduled", "num_tokens", "kv_tokens", "pairs")

    def __init__(self, scheduled: list[tuple[SimSequence, int]], num_tokens: int, kv_tokens: int,
                 pairs: int) -> None:
        self.scheduled = scheduled
        self.num_tokens = num_tokens     # tokens computed this step (prefill + decode)
        self.kv_tokens = kv_tokens       # KV entries read
        self.pairs = pairs               # (query, key) attention pairs


class SimScheduler:
    def __init__(self, *, num_kv_blocks: int, block_size: int, max_batch_size: int, max_num_tokens: int) -> None:
        self.num_kv_blocks, self.block_size = num_kv_blocks, block_size
        self.max_batch_size, self.max_num_tokens = max_batch_size, max_num_tokens
        self.free_blocks = num_kv_blocks
        self.running: list[SimSequence] = []
        self.waiting: collections.deque[SimSequence] = collections.deque()
        self.preemptions = 0
        self._capacity: Capacity | None = None   # cached until the next change

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, seq: SimSequence) -> None:
        self.waiting.append(seq)
        self._capacity = None

    def remove(self, seq: SimSequence) -> None:
        """Release the sequence's slot and blocks now (it finished or was aborted)."""
        if seq.first_scheduled is not None and seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.free_blocks += seq.blocks
        seq.blocks = 0
        self._capacity = None

    def computed(self, plan: StepPlan) -> None:
        """The step ran: its sequences (those not removed meanwhile) have their tokens' KV."""
        for seq, n in plan.scheduled:
            if not seq.done:
                seq.num_computed += n
        self._capacity = None

    def capacity(self) -> Capacity:
        cap = self._capacity
        if cap is None:
            # Never over-report: blocks that waiting and still-prefilling sequences will need are taken.
            # Pending prefill: every waiting context (new or preempted, num_computed 0), and what running
            # sequences still have to compute beyond a decode's single token (chunked or recomputing).
            bs = self.block_size
            reserved = pending = 0
            for s in self.waiting:
                context = s.prompt_len + len(s.output)
                reserved += blocks_for(context, bs)
                pending += context - s.num_computed
            for s in self.running:
                left = s.prompt_len + len(s.output) - s.num_computed
                if left > 1 or not s.output:
                    pending += left
                if s.num_computed < s.prompt_len:
                    reserved += blocks_for(s.prompt_len, bs) - s.blocks
            free = max(0, self.free_blocks - reserved)
            cap = self._capacity = Capacity(
                free_kv_blocks=free, free_kv_tokens=free * bs, waiting=len(self.waiting), block_size=bs,
                free_slots=max(0, self.max_batch_size - len(self.running) - len(self.waiting)),
                pending_prefill_tokens=pending)
        return cap

    def schedule(self) -> StepPlan:
        """Pick this step's work: running sequences first (oldest first), then FCFS from waiting."""
        budget = self.max_num_tokens
        bs = self.block_size
        free = self.free_blocks
        running = self.running
        scheduled: list[tuple[SimSequence, int]] = []
        kv_tokens = pairs = 0
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            start = seq.num_computed
            n = seq.prompt_len + len(seq.output) - start
            if n > budget:
                n = budget
            need = -(-(start + n) // bs) - seq.blocks
            if need > free:
                preempted = True
                while need > free and running[-1] is not seq:
                    free += self._preempt(running.pop())
                if need > free:   # it is the newest itself
                    free += self._preempt(running.pop())
                    break
            if need > 0:
                free -= need
                seq.blocks += need
            scheduled.append((seq, n))
            budget -= n
            kv_tokens += start + n
            pairs += n * start + n * (n + 1) // 2
            i += 1
        waiting = self.waiting
        if not preempted:
            now = time.monotonic()
            max_batch = self.max_batch_size
            while waiting and budget > 0 and len(running) < max_batch:
                seq = waiting[0]
                n = min(seq.prompt_len + len(seq.output), budget)
                need = -(-n // bs)
                if need > free:
                    break
                waiting.popleft()
                free -= need
                seq.blocks = need
                if seq.first_scheduled is None:
                    seq.first_scheduled = now
                running.append(seq)
                scheduled.append((seq, n))
                budget -= n
                kv_tokens += n
                pairs += n * (n + 1) // 2
        self.free_blocks = free
        self._capacity = None
        return StepPlan(scheduled, self.max_num_tokens - budget, kv_tokens, pairs)

    def _preempt(self, seq: SimSequence) -> int:
        """Drop a sequence's KV and put it at the head of the waiting queue (it will be recomputed)."""
        freed, seq.blocks, seq.num_computed = seq.blocks, 0, 0
        self.preemptions += 1
        self.waiting.appendleft(seq)
        return freed


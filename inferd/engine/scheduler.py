"""Continuous batching: which sequences run this step, and how many tokens each.

One token budget per step is shared by the decode tokens of running sequences (served first,
oldest first) and the prefill of waiting ones (chunked to fit, FCFS: fairness is decided by
admission in front of the engine). When the KV pool runs out, a running sequence is preempted: the
newest of the tenant holding the most blocks per unit of weight (inferd.engine.victims; with one
tenant, the newest); its blocks are freed and it is recomputed later from its tokens so far. Admission may also
`park` a sequence (another tenant is owed its slot): preempted the same way, it waits in `parked` and
resumes only when nothing waits, so it does not take back at once the slot it gave up.

`schedule()` returns a plain SchedulerOutput carrying the step's packed arrays; after the model
ran, `update_from_output()` takes the sampled tokens back. No model here: tested with integers.

Two policies are arguments, because the backends that share this scheduler differ there:
`reserve_whole_prompt` admits a waiting sequence only when its whole remaining prompt fits (the
reference engine: a chunked prefill is never preempted by its own later chunks); without it, when
the step's chunk fits (the sim, which models an engine that allocates as contexts grow).
`pack_inputs=False` skips the packed arrays for an executor that has no model to feed (the sim).

Fork (with prefix caching, so the reference engine and not the sim, whose n sequences cost n): a
waiting sequence whose prompt (and salt) is the same as a running one's (the `n` choices of one
prompt) waits until that one has computed all but the prompt's last token, then starts from its
blocks (BlockManager.fork: full blocks shared, the partial one copied) and computes only that last
token, for logits of its own. The copies are in SchedulerOutput.block_copies, for the engine to make
before the step's forward pass.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
import hashlib

import numpy as np

from inferd.engine.block_manager import BlockManager
from inferd.engine.sequence import Sequence, SequenceStatus
from inferd.engine.step_output import SchedulerOutput
from inferd.engine.step_packing import pack_step
from inferd.engine.step_update import StepUpdate
from inferd.engine.victims import victim_index
from inferd.types import FinishReason


class Scheduler(StepUpdate):
    def __init__(self, block_manager: BlockManager, *, max_batch_size: int, max_num_tokens: int,
                 max_model_len: int, eos_token_ids: Iterable[int] = (), reserve_whole_prompt: bool = True,
                 pack_inputs: bool = True) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_num_tokens < 1:
            raise ValueError(f"max_num_tokens must be >= 1, got {max_num_tokens}")
        self.block_manager = block_manager
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.reserve_whole_prompt = reserve_whole_prompt
        self.pack_inputs = pack_inputs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # admission order: newest last
        self.parked: deque[Sequence] = deque()     # gave their slot up (park): resume when nothing waits
        self.num_preemptions = 0
        self.num_parked = 0                        # park()s done, since start
        self.num_forks = 0
        # prompt key -> the running sequence computing that prompt, which later identical ones fork from
        self._leaders: dict[bytes, Sequence] | None = {} if block_manager.prefix_caching else None

    # -- queue ---------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.parked)

    def park(self, seq: Sequence) -> bool:
        """Take `seq` (running or waiting) out of its slot: its blocks are freed and it is recomputed from
        its tokens so far once it resumes, when a slot is free and nothing waits. Call between steps (or
        for an executor that reads no KV: the step in flight skips it, see advance). False: not held."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._forget_leader(seq)
            self.block_manager.free(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        else:
            return False
        seq.draft.clear()
        seq.draft_kv_len = 0
        seq.status = SequenceStatus.WAITING
        self.parked.append(seq)
        self.num_parked += 1
        return True

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence wherever it is (abort, stop string, error) and free its blocks."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            self.parked.remove(seq)
        self._forget_leader(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    # -- one step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        bm = self.block_manager
        budget = self.schedule_running(out)
        out.first_admitted = len(out.seqs)
        # a preemption means the pool is short: admitting more would only thrash. Parked sequences
        # come back only behind everything waiting.
        while not out.preempted and budget > 0 and len(self.running) < self.max_batch_size:
            queue = self.waiting or self.parked
            if not queue:
                break
            seq = queue[0]
            leader = self._leader_of(seq) if self._leaders is not None else None
            if leader is not None:
                # its prompt is being computed: fork once it is (FCFS, so the rest wait with it)
                if leader.num_computed_tokens < seq.num_tokens - 1 or not bm.can_fork():
                    break
                copy = bm.fork(leader, seq, seq.num_tokens - 1)
                if copy is not None:
                    out.block_copies.append(copy)
                self.num_forks += 1
                n = 1
            else:
                cached = bm.lookup_prefix(seq)
                remaining = seq.num_tokens - len(cached) * bm.block_size
                n = min(remaining, budget)
                # admit only when the whole remaining prompt fits, so a chunked prefill is not
                # preempted half-way by its own later chunks (or, without reserve_whole_prompt, this chunk)
                if not bm.can_allocate(seq, cached, remaining if self.reserve_whole_prompt else n):
                    break
                bm.allocate(seq, cached, n)
                if seq.prompt_key is not None and not seq.admitted:
                    self._leaders[seq.prompt_key] = seq
            queue.popleft()
            if queue is self.parked:
                out.resumed.append(seq)
            if not seq.admitted:
                seq.admitted = True
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n
            end = seq.num_computed_tokens + n
            out.kv_tokens += end
            out.attention_pairs += n * end - n * (n - 1) // 2    # sum of (start + j) for j in 1..n
        if out.seqs and self.pack_inputs:
            pack_step(out, self.block_manager.block_size)
        return out

    def schedule_running(self, out: SchedulerOutput) -> int:
        """Running sequences first, oldest first, preempting (inferd.engine.victims) when the pool is short;
        returns the token budget left for waiting ones. Runs for every running sequence every step, so the common
        case (a decode whose token fits the blocks it holds) is written out inline, with local names."""
        bs = self.block_manager.block_size
        running = self.running
        add_seq, add_count = out.seqs.append, out.num_new_tokens.append
        budget = self.max_num_tokens
        kv_tokens = pairs = 0
        i, count = 0, len(running)
        while i < count and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            n = len(seq.token_ids) - computed
            draft = seq.draft
            if draft:                               # verified with its last token: as many as the budget holds
                del draft[max(budget - n, 0):]
                n += len(draft)
            if n > budget:
                n = budget
            end = computed + n
            if draft and end > len(seq.block_table) * bs and not self.block_manager.can_append(seq, n):
                n -= len(draft)                     # a draft never preempts anyone: it goes instead
                end -= len(draft)
                draft.clear()
            if end > len(seq.block_table) * bs:
                out.kv_tokens += kv_tokens          # the slow path may take back what is counted so far
                out.attention_pairs += pairs
                kv_tokens = pairs = 0
                kept, undone, freed = self._make_room(seq, i, n, out)
                i -= undone                         # sequences before it, scheduled, then preempted
                budget += freed
                count = len(running)
                if not kept:
                    continue                        # it was preempted itself
            count = len(running)
            add_seq(seq)
            add_count(n)
            budget -= n
            kv_tokens += end
            pairs += end if n == 1 else n * end - n * (n - 1) // 2     # sum of (computed + j), j = 1..n
            i += 1
        out.kv_tokens += kv_tokens
        out.attention_pairs += pairs
        return budget

    def _make_room(self, seq: Sequence, i: int, n: int, out: SchedulerOutput) -> tuple[bool, int, int]:
        """Blocks for `n` more tokens of `seq` (running[i]), preempting sequences until they fit: the newest
        of the tenant holding the most blocks per weight (inferd.engine.victims; with one tenant, the
        newest). Returns (whether `seq` kept its place, how many sequences before it were preempted, the
        tokens of theirs this step had scheduled, handed back to the budget)."""
        bm = self.block_manager
        running = self.running
        undone = freed = 0
        while not bm.can_append(seq, n):
            j = victim_index(running)
            victim = running.pop(j)
            if j < i:                   # already in this step's batch: take it out again
                freed += self._unschedule(victim, j, out)
                undone += 1
                i -= 1
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False, undone, freed
        bm.append(seq, n)
        return True, undone, freed

    @staticmethod
    def _unschedule(seq: Sequence, j: int, out: SchedulerOutput) -> int:
        """Remove row `j` (`seq`, a running sequence scheduled this step) from `out`; its token count."""
        del out.seqs[j]
        n = out.num_new_tokens.pop(j)
        end = seq.num_computed_tokens + n
        out.kv_tokens -= end
        out.attention_pairs -= n * end - n * (n - 1) // 2
        return n

    def _leader_of(self, seq: Sequence) -> Sequence | None:
        """The running sequence `seq` (never admitted yet) can fork from: same salt, same prompt. Never for
        one that needs its prompt's logits: a fork computes only the last prompt token."""
        if seq.admitted or seq.num_tokens < 2 or seq.needs_prompt_logits:
            return None
        if seq.prompt_key is None:
            tokens = np.asarray(seq.token_ids, dtype=np.int64).tobytes()
            seq.prompt_key = hashlib.blake2b(seq.salt + tokens, digest_size=16).digest()
        return self._leaders.get(seq.prompt_key)

    def _forget_leader(self, seq: Sequence) -> None:
        """`seq` stops holding its prompt's blocks (finished, preempted): nothing forks from it any more."""
        if self._leaders is not None and seq.prompt_key is not None and self._leaders.get(seq.prompt_key) is seq:
            del self._leaders[seq.prompt_key]

    def _preempt(self, seq: Sequence) -> None:
        seq.draft.clear()               # a recompute starts from the tokens it has
        seq.draft_kv_len = 0
        self._forget_leader(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)     # first in line again: it was admitted before the rest
        self.num_preemptions += 1

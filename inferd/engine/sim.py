"""The simulated engine: in-flight batching over a paged KV pool, timed by a roofline model.

It exists for load tests and scheduling benchmarks at GPU-scale concurrency on CPU machines.
Every step is scheduled like a real engine's (FCFS waiting queue, one token budget shared by
decodes and chunked prefills, `max_batch_size` slots, KV blocks allocated as contexts grow, the
newest sequence preempted and recomputed when blocks run out), then the step loop sleeps for
the step time the profile's roofline predicts (times `time_scale`; 0 = no sleeping at all) and
emits one synthetic token per sequence that finished its prefill. Steps already due (time_scale
0, or a loop that fell behind) may run back to back within a fair share of a busy loop (see
_SLICE_S): a GPU does not wait for the host's event loop. Tokens are a deterministic function of
(prompt, seed, position). It reports itself as a simulator (info.simulated).

Everything runs on the event loop: the step's Python cost is a few microseconds per sequence,
so no thread is needed, and deltas are pushed from the loop thread as RequestStream requires.
Stats (step latency, tokens/s) are in *simulated* time: what the modelled GPU would do.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import random
import time

import msgspec

from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats, EngineUnavailable, InvalidRequest
from inferd.engine.sim_profiles import SimProfile, blocks_for, get_profile, sim_tokenizer
from inferd.engine.stream import RequestStream
from inferd.engine.validation import failure_message, seed64, validate_request
from inferd.log import get_logger
from inferd.tokenization import StopMatcher
from inferd.types import Delta, EngineTiming, FinishReason, GenerationRequest, Usage

log = get_logger(__name__)
_EOS_SCALE = 1 << 20
_MAX_LAG_S = 0.005   # how far behind the simulated timeline the loop may run before it stops catching up
# Steps that are due run back to back while the step loop's turn has used less CPU than the rest
# of the loop used since its previous turn, and at most _SLICE_S: when the loop is busy (say,
# writing frames for hundreds of streams) the engine gets an even share of it, as a step thread
# would of the GIL, instead of its pace being one step per loop turn; when the loop is idle, one
# step per turn, as before. The cap keeps the loop responsive (new requests, pings, disconnects)
# within ~2 ms. At 256 streams it sets how many tokens ride in a frame: bench/frontend.py measured
# 1 ms -> ~1.7 tokens/frame, 2 ms -> ~4, 3 ms -> ~5.5 (fewer, fuller frames as it grows).
_SLICE_S = 0.002
_cpu = time.thread_time


class _Seq:
    __slots__ = ("request_id", "stream", "prompt_len", "output", "num_computed", "blocks", "max_tokens",
                 "key", "stop_ids", "eos_threshold", "matcher", "submitted", "first_scheduled",
                 "first_token", "done")

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


class SimEngine(Engine):
    def __init__(self, profile: str | SimProfile, *, num_kv_blocks: int | None = None, block_size: int = 16,
                 max_batch_size: int = 256, max_num_tokens: int = 8192, time_scale: float = 1.0,
                 model_name: str = "sim", max_model_len: int = 8192, seed: int = 0) -> None:
        self.profile = get_profile(profile)
        for name, value in (("block_size", block_size), ("max_batch_size", max_batch_size),
                            ("max_num_tokens", max_num_tokens), ("max_model_len", max_model_len)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if num_kv_blocks is None:
            num_kv_blocks = self.profile.num_kv_blocks(block_size)
        elif not isinstance(num_kv_blocks, int) or num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be a positive integer, got {num_kv_blocks!r}")
        if not time_scale >= 0:
            raise ValueError(f"time_scale must be >= 0, got {time_scale!r}")
        self.tokenizer = sim_tokenizer(self.profile.vocab_size)
        digest = hashlib.sha256(msgspec.json.encode(self.profile)).hexdigest()[:12]
        # A sequence can never outgrow the whole KV pool: advertise that bound, or the API would
        # default max_tokens to a context this engine then refuses.
        max_model_len = min(max_model_len, num_kv_blocks * block_size)
        self.info = EngineInfo(backend="sim", model_name=model_name, version=f"sim-{digest}",
                               max_model_len=max_model_len, block_size=block_size, num_kv_blocks=num_kv_blocks,
                               max_batch_size=max_batch_size, max_num_tokens=max_num_tokens, simulated=True)
        self.time_scale = float(time_scale)
        self._rng = random.Random(seed)
        self._free_blocks = num_kv_blocks
        self._seqs: dict[str, _Seq] = {}
        self._running: list[_Seq] = []
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self._failed = False
        self._capacity: Capacity | None = None
        self._eos_ids = frozenset(self.tokenizer.eos_token_ids)
        # stats, in simulated seconds
        self.sim_time = 0.0               # simulated seconds of GPU work so far
        self.preemptions = 0
        self._steps = self._prompt_tokens = self._gen_tokens = 0
        self._last_step_s = 0.0
        self._ema_tokens = self._ema_time = 0.0

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._step_loop(), name="sim-engine-steps")
            self._task.add_done_callback(self._loop_ended)

    async def warmup(self) -> None:
        """Nothing to warm: the tokenizer was built in __init__ and there are no kernels to compile."""
        if self._task is None:
            raise EngineUnavailable("sim engine not started")

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:   # the loop had failed: already logged, its requests already ended
                pass
        for request_id in list(self._seqs):
            self.abort(request_id)

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._closed and not self._failed

    def _loop_ended(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self._failed = True   # a bug in the step loop: fail in-flight requests, report unhealthy
        for seq in list(self._seqs.values()):
            self._finish(seq, FinishReason.ERROR, [], "", error=failure_message(seq.request_id))

    # -- requests --------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestStream:
        if not self.healthy:
            raise EngineUnavailable("sim engine is not running")
        seq = self._new_seq(request)
        self._seqs[request.request_id] = seq
        self._waiting.append(seq)
        self._prompt_tokens += seq.prompt_len
        self._capacity = None
        self._wakeup.set()
        return seq.stream

    def _new_seq(self, request: GenerationRequest) -> _Seq:
        """Check the request (InvalidRequest naming the field) and build its sequence."""
        sp, prompt = request.sampling, request.prompt_token_ids
        if request.request_id in self._seqs:
            raise InvalidRequest(f"request id {request.request_id!r} is already in flight", "request_id")
        # max_model_len is already bounded by the KV pool (see __init__): no separate capacity check
        validate_request(request, vocab_size=self.tokenizer.vocab_size, max_model_len=self.info.max_model_len)
        if request.lora is not None:
            raise InvalidRequest("the sim backend serves no LoRA adapters", "model")
        # Greedy output depends on the prompt only; sampled output on prompt and seed (or fresh entropy).
        key = hash(tuple(prompt))
        if not sp.greedy:
            key = hash((key, seed64(sp.seed) if sp.seed is not None else self._rng.getrandbits(62), 1))
        stop_ids = frozenset(sp.stop_token_ids) | (frozenset() if sp.ignore_eos else self._eos_ids)
        eos_threshold = 0 if sp.ignore_eos else int(self.profile.eos_probability * _EOS_SCALE)
        stream = RequestStream(request.request_id, on_cancel=self.abort)
        return _Seq(request.request_id, stream, len(prompt), sp.max_tokens, key, stop_ids, eos_threshold,
                    StopMatcher(sp.stop) if sp.stop else None)

    def abort(self, request_id: str) -> None:
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._finish(seq, FinishReason.ABORT, [], "")

    def _finish(self, seq: _Seq, reason: FinishReason, token_ids: list[int], text: str,
                error: str | None = None) -> None:
        """Release the sequence's slot and blocks now, and end its stream."""
        seq.done = True
        del self._seqs[seq.request_id]
        if seq.first_scheduled is not None and seq in self._running:
            self._running.remove(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)
        self._free_blocks += seq.blocks
        seq.blocks = 0
        self._capacity = None
        timing = EngineTiming(submitted=seq.submitted, first_scheduled=seq.first_scheduled,
                              first_token=seq.first_token, finished=time.monotonic())
        usage = Usage(prompt_tokens=seq.prompt_len, completion_tokens=len(seq.output))
        seq.stream.push(Delta(token_ids=token_ids, text=text, finish_reason=reason, usage=usage, timing=timing,
                              error=error))

    # -- admission's view ------------------------------------------------------------------------
    def capacity(self) -> Capacity:
        cap = self._capacity
        if cap is None:
            # Never over-report: blocks that waiting and still-prefilling sequences will need are taken.
            # Pending prefill: every waiting context (new or preempted, num_computed 0), and what running
            # sequences still have to compute beyond a decode's single token (chunked or recomputing).
            bs = self.info.block_size
            reserved = pending = 0
            for s in self._waiting:
                context = s.prompt_len + len(s.output)
                reserved += blocks_for(context, bs)
                pending += context - s.num_computed
            for s in self._running:
                left = s.prompt_len + len(s.output) - s.num_computed
                if left > 1 or not s.output:
                    pending += left
                if s.num_computed < s.prompt_len:
                    reserved += blocks_for(s.prompt_len, bs) - s.blocks
            free = max(0, self._free_blocks - reserved)
            cap = self._capacity = Capacity(
                free_kv_blocks=free, free_kv_tokens=free * bs, waiting=len(self._waiting), block_size=bs,
                free_slots=max(0, self.info.max_batch_size - len(self._running) - len(self._waiting)),
                pending_prefill_tokens=pending)
        return cap

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running), waiting=len(self._waiting), kv_blocks_total=self.info.num_kv_blocks,
            kv_blocks_used=self.info.num_kv_blocks - self._free_blocks, prefix_cache_hit_rate=0.0,
            step_latency_s=self._last_step_s, steps_total=self._steps, prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._gen_tokens, prefix_cache_hit_tokens_total=0,
            tokens_per_s=self._ema_tokens / self._ema_time if self._ema_time else 0.0)

    # -- the step loop ---------------------------------------------------------------------------
    async def _step_loop(self) -> None:
        try:
            await self._run_steps()
        except Exception:   # clients get failure_message (see _loop_ended); the details go here
            log.exception("sim_engine_step_loop_failed", request_ids=list(self._seqs))
            raise

    async def _run_steps(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.time_scale
        deadline = loop.time()
        # CPU time (not wall time: being descheduled is nobody's turn) of this turn of the step
        # loop, and what the rest of the loop used between its previous turn and this one.
        turn_start, others = _cpu(), 0.0
        while True:
            if not self._running and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                deadline = loop.time()
                turn_start, others = _cpu(), 0.0
                continue
            scheduled, num_tokens, kv_tokens, pairs = self._schedule()
            step_s = self.profile.step_time(num_tokens, kv_tokens, pairs)
            self._account(num_tokens, step_s)
            wait = 0.0
            if scale > 0:
                # Sleep on the simulated timeline, not per step: timer rounding does not accumulate.
                deadline = max(deadline, loop.time() - _MAX_LAG_S) + step_s * scale
                wait = deadline - loop.time()
            # The simulated GPU does not wait for the loop: a step already due (time_scale 0, or a
            # timeline the loop fell behind) follows at once, within this turn's fair share.
            if wait > 0 or _cpu() - turn_start >= min(others, _SLICE_S):
                yielded = _cpu()
                await asyncio.sleep(max(0.0, wait))
                turn_start = _cpu()
                others = turn_start - yielded
            self._complete(scheduled)

    def _account(self, num_tokens: int, step_s: float) -> None:
        self._steps += 1
        self.sim_time += step_s
        self._last_step_s = step_s
        self._ema_tokens = 0.9 * self._ema_tokens + 0.1 * num_tokens
        self._ema_time = 0.9 * self._ema_time + 0.1 * step_s
        observer = self.step_observer
        if observer is not None:   # simulated seconds, as the stats: what the modelled GPU would take
            try:
                observer(step_s)
            except Exception:   # metrics must never take the engine down
                log.exception("step_observer_failed")

    def _schedule(self) -> tuple[list[tuple[_Seq, int]], int, int, int]:
        """Pick this step's work: running sequences first (oldest first), then FCFS from waiting."""
        budget = self.info.max_num_tokens
        bs = self.info.block_size
        free = self._free_blocks
        running = self._running
        scheduled: list[tuple[_Seq, int]] = []
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
        waiting = self._waiting
        if not preempted:
            now = time.monotonic()
            max_batch = self.info.max_batch_size
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
        self._free_blocks = free
        self._capacity = None
        return scheduled, self.info.max_num_tokens - budget, kv_tokens, pairs

    def _preempt(self, seq: _Seq) -> int:
        """Drop a sequence's KV and put it at the head of the waiting queue (it will be recomputed)."""
        freed, seq.blocks, seq.num_computed = seq.blocks, 0, 0
        self.preemptions += 1
        self._waiting.appendleft(seq)
        return freed

    def _complete(self, scheduled: list[tuple[_Seq, int]]) -> None:
        """The step's results: one new token for every sequence whose context is now fully computed."""
        tokenizer = self.tokenizer
        gen_ids = tokenizer.generation_ids
        num_gen = len(gen_ids)
        pieces = tokenizer._pieces
        now = time.monotonic()
        produced = 0
        for seq, n in scheduled:
            if seq.done:
                continue   # aborted while the step ran
            seq.num_computed += n
            out = seq.output
            pos = len(out)
            if seq.num_computed < seq.prompt_len + pos:
                continue   # a prefill chunk: no token yet
            key = seq.key
            token = gen_ids[hash((key, pos)) % num_gen]
            if seq.eos_threshold and hash((key, pos, 2)) % _EOS_SCALE < seq.eos_threshold:
                token = tokenizer.eos_token_ids[0]
            out.append(token)
            produced += 1
            if seq.first_token is None:
                seq.first_token = now
            if token in seq.stop_ids:
                text = seq.matcher.flush() if seq.matcher is not None else ""
                self._finish(seq, FinishReason.STOP, [token], text)
                continue
            text = pieces[token]
            if seq.matcher is not None:
                text, stopped = seq.matcher.push(text)
                if stopped:
                    self._finish(seq, FinishReason.STOP, [token], text)
                    continue
            if pos + 1 >= seq.max_tokens:
                if seq.matcher is not None:
                    text += seq.matcher.flush()
                self._finish(seq, FinishReason.LENGTH, [token], text)
                continue
            seq.stream.push_token(token, text)
        self._gen_tokens += produced

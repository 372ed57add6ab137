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

Scheduling is the shared scheduler and block manager (inferd.engine.scheduler, seen through
inferd.engine.sim.scheduler); this module is the simulated executor's lifecycle, requests, step loop,
stats and adapters: it times the steps, and sim.emit turns each step's results into tokens and stream
pushes. Everything runs on the event loop: the step's Python cost is a few microseconds per sequence,
so no thread is needed, and deltas are pushed from the loop thread as RequestStream requires.
Stats (step latency, tokens/s) are in *simulated* time: what the modelled GPU would do.
"""
from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Iterable

import msgspec

from inferd.engine.adapters import AdapterInfo, UnknownAdapter
from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats, EngineUnavailable, InvalidRequest
from inferd.engine.grammar import GrammarState
from inferd.engine.sim.emit import EOS_SCALE, StepOutput
from inferd.engine.sim.guided import Compiling, sim_grammars
from inferd.engine.sim.lora import SimAdapters
from inferd.engine.sim.profiles import SimProfile, get_profile, sim_tokenizer
from inferd.engine.sim.speculation import SimSpeculation
from inferd.engine.sim.scheduler import SimScheduler, SimSequence
from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import StopMatcher
from inferd.engine.validation import failure_message, seed64, validate_request
from inferd.observability import get_logger
from inferd.types import Delta, EngineTiming, FinishReason, GenerationRequest, Usage

log = get_logger("inferd.engine.sim")   # the name operators filter on; it predates the sim package
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


class SimEngine(Engine):
    """`lora_adapters`: the adapter names requests may use (an AdapterHost; rank `lora_rank`, cost sim.lora)."""

    compiles_missed_grammars = True      # on its GrammarWorker (sim.guided.Compiling), never on the loop
    yields_slots = True

    def __init__(self, profile: str | SimProfile, *, num_kv_blocks: int | None = None, block_size: int = 16,
                 max_batch_size: int = 256, max_num_tokens: int = 8192, time_scale: float = 1.0,
                 model_name: str = "sim", max_model_len: int = 8192, seed: int = 0,
                 lora_adapters: Iterable[str] = (), lora_rank: int = 16, simulate_load: bool = False,
                 speculation: SimSpeculation | None = None) -> None:
        self.profile = get_profile(profile)
        self._speculation = speculation          # its step times from an acceptance rate (sim.speculation)
        self._adapters = SimAdapters(lora_adapters, self.profile, rank=lora_rank)
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
        self.grammars = sim_grammars(self.tokenizer)
        self._output = StepOutput(self.tokenizer, self._finish)   # each step's tokens and pushes (sim.emit)
        digest = hashlib.sha256(msgspec.json.encode(self.profile)).hexdigest()[:12]
        # A sequence can never outgrow the whole KV pool: advertise that bound, or the API would
        # default max_tokens to a context this engine then refuses.
        max_model_len = min(max_model_len, num_kv_blocks * block_size)
        self.info = EngineInfo(backend="sim", model_name=model_name, version=f"sim-{digest}",
                               max_model_len=max_model_len, block_size=block_size, num_kv_blocks=num_kv_blocks,
                               max_batch_size=max_batch_size, max_num_tokens=max_num_tokens, simulated=True,
                               hardware=self.profile.name, precision=self.profile.precision)
        self.time_scale = float(time_scale)
        # What start() takes, like reading the weights and building the KV pool (so a cold start takes time).
        self.load_s = self.profile.load_time_s() * self.time_scale if simulate_load else 0.0
        self._rng = random.Random(seed)
        self._scheduler = SimScheduler(num_kv_blocks=num_kv_blocks, block_size=block_size,
                                       max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)
        self._seqs: dict[str, SimSequence] = {}
        self._compiling = Compiling(self.grammars)     # grammars missed by the cache compile there (sim.guided)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self._failed = False
        self._eos_ids = frozenset(self.tokenizer.eos_token_ids)
        # stats, in simulated seconds
        self.sim_time = 0.0               # simulated seconds of GPU work so far
        self._steps = self._prompt_tokens = self._gen_tokens = 0
        self._last_step_s = 0.0
        self._step_cpu_s = 0.0          # CPU time of the step loop's turns on the event loop, since start
        self._ema_tokens = self._ema_time = 0.0

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.load_s > 0 and self._task is None:
            await asyncio.sleep(self.load_s)
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
            self.abort(request_id)    # those whose grammar compiles too (their compile is dropped)
        self._compiling.close()

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
        self._adapters.acquire(seq, request.lora)
        self._prompt_tokens += seq.prompt_len
        guided = request.sampling.guided
        ready = self._compiling.ready(guided) if guided is not None else None
        if guided is not None and ready is None:       # not compiled (or evicted since): compile, then schedule
            self._compiling.start(seq.request_id, guided, lambda grammar: self._add(seq, grammar),
                                  lambda why: self._finish(seq, FinishReason.ERROR, [], "",
                                                           error=why or failure_message(seq.request_id)))
            return seq.stream
        self._add(seq, ready)
        return seq.stream

    def _add(self, seq: SimSequence, grammar: GrammarState | None) -> None:
        seq.grammar = grammar
        # Its tokens need nothing but (key, position) and their pieces: StepOutput.complete's short path.
        seq.plain = (grammar is None and seq.matcher is None and seq.logprobs is None
                     and seq.prompt_logprobs is None)
        self._scheduler.add(seq)
        self._wakeup.set()

    def _new_seq(self, request: GenerationRequest) -> SimSequence:
        """Check the request (InvalidRequest naming the field) and build its sequence."""
        sp, prompt = request.sampling, request.prompt_token_ids
        if request.request_id in self._seqs:
            raise InvalidRequest(f"request id {request.request_id!r} is already in flight", "request_id")
        # max_model_len is already bounded by the KV pool (see __init__): no separate capacity check
        validate_request(request, vocab_size=self.tokenizer.vocab_size, max_model_len=self.info.max_model_len)
        self._adapters.check(request.lora)
        # Greedy output depends on the prompt only; sampled output on prompt and seed (or fresh entropy).
        key = self._adapters.output_key(hash(tuple(prompt)), request.lora)
        if not sp.greedy:
            key = hash((key, seed64(sp.seed) if sp.seed is not None else self._rng.getrandbits(62), 1))
        stop_ids = frozenset(sp.stop_token_ids) | (frozenset() if sp.ignore_eos else self._eos_ids)
        eos_threshold = 0 if sp.ignore_eos else int(self.profile.eos_probability * EOS_SCALE)
        stream = RequestStream(request.request_id, on_cancel=self.abort)
        seq = SimSequence(request.request_id, stream, prompt, sp.max_tokens, key, stop_ids, eos_threshold,
                          StopMatcher(sp.stop) if sp.stop else None)
        seq.logprobs, seq.prompt_logprobs = sp.logprobs, sp.prompt_logprobs
        seq.tenant, seq.weight = request.tenant, request.weight
        return seq

    def yield_slot(self, request_id: str) -> bool:
        seq = self._seqs.get(request_id)
        if seq is None or seq.done or not self._scheduler.park(seq):
            return False
        self._wakeup.set()
        return True

    def abort(self, request_id: str) -> None:
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._finish(seq, FinishReason.ABORT, [], "")

    def _finish(self, seq: SimSequence, reason: FinishReason, token_ids: list[int], text: str,
                error: str | None = None, lp: dict | None = None) -> None:
        """Release the sequence's slot and blocks now, and end its stream."""
        seq.done = True
        del self._seqs[seq.request_id]
        self._adapters.release(seq)
        if not self._compiling.discard(seq.request_id):
            self._scheduler.remove(seq, reason)
        timing = EngineTiming(submitted=seq.submitted, first_scheduled=seq.first_scheduled,
                              first_token=seq.first_token, finished=time.monotonic())
        usage = Usage(prompt_tokens=seq.prompt_len, completion_tokens=seq.num_completion_tokens)
        seq.stream.push(Delta(token_ids=token_ids, text=text, finish_reason=reason, usage=usage, timing=timing,
                              error=error, **(lp or {})))


    # -- admission's view ------------------------------------------------------------------------
    def capacity(self) -> Capacity:
        return self._scheduler.capacity()

    @property
    def preemptions(self) -> int:
        """Sequences preempted (and later recomputed) because the KV pool ran out, since start."""
        return self._scheduler.preemptions

    def stats(self) -> EngineStats:
        sched = self._scheduler
        return EngineStats(
            running=len(sched.running), waiting=len(sched.waiting) + sched.parked,
            kv_blocks_total=self.info.num_kv_blocks,
            kv_blocks_used=self.info.num_kv_blocks - sched.free_blocks, prefix_cache_hit_rate=0.0,
            step_latency_s=self._last_step_s, steps_total=self._steps, prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._gen_tokens, prefix_cache_hit_tokens_total=0,
            tokens_per_s=self._ema_tokens / self._ema_time if self._ema_time else 0.0,
            fairness_preemptions_total=sched.fairness_preemptions,
            speculation=self._speculation.stats() if self._speculation is not None else None,
            step_cpu_seconds_total=self._step_cpu_s)

    def _step_time(self, plan) -> float:
        spec = self._speculation
        if spec is None:
            return self.profile.step_time(plan.num_tokens, plan.kv_tokens, plan.pairs)
        decodes = sum(1 for seq, n in plan.scheduled if n == 1 and seq.num_completion_tokens)
        return spec.step_time(self.profile, plan.num_tokens, plan.kv_tokens, plan.pairs, decodes,
                              prefill=decodes < len(plan.scheduled))

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
            if not self._scheduler.has_work():
                self._step_cpu_s += _cpu() - turn_start
                self._wakeup.clear()
                await self._wakeup.wait()
                deadline = loop.time()
                turn_start, others = _cpu(), 0.0
                continue
            plan = self._scheduler.schedule()
            for seq in plan.output.resumed:     # parked ones that hold a slot again: admission is told
                seq.stream.resumed()
            step_s = self._step_time(plan)
            if self._adapters.in_use_total:
                step_s += self._adapters.step_time(plan.scheduled)
            self._account(plan.num_tokens, step_s)
            wait = 0.0
            if scale > 0:
                # Sleep on the simulated timeline, not per step: timer rounding does not accumulate.
                deadline = max(deadline, loop.time() - _MAX_LAG_S) + step_s * scale
                wait = deadline - loop.time()
            # The simulated GPU does not wait for the loop: a step already due (time_scale 0, or a
            # timeline the loop fell behind) follows at once, within this turn's fair share.
            if wait > 0 or _cpu() - turn_start >= min(others, _SLICE_S):
                yielded = _cpu()
                self._step_cpu_s += yielded - turn_start
                await asyncio.sleep(max(0.0, wait))
                turn_start = _cpu()
                others = turn_start - yielded
            self._scheduler.computed(plan)
            self._gen_tokens += self._output.complete(plan.scheduled)

    # -- LoRA adapters (engine.adapters.AdapterHost): names only, nothing to read ----------------
    def adapters(self) -> list[AdapterInfo]:
        return self._adapters.infos()

    def adapter(self, name: str) -> AdapterInfo | None:
        try:
            return self._adapters.info(name)
        except UnknownAdapter:
            return None

    async def load_adapter(self, name: str) -> AdapterInfo:
        return self._adapters.load(name)

    async def unload_adapter(self, name: str) -> bool:
        return self._adapters.unload(name)

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

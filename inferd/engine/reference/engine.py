"""ReferenceEngine: the NumPy Llama decoder behind continuous batching, on its own step thread.

The event loop only enqueues commands (submit, abort) and receives each step's deltas in one
`call_soon_threadsafe`. The step thread owns the scheduler, the KV cache and every Sequence:
take commands -> schedule -> forward -> sample -> update -> detokenize -> publish a capacity
snapshot -> hand the deltas to the loop. It sleeps on a Condition when there is nothing to do.
LoRA adapters (adapter_host) load on a loader thread; a finished load reaches the step thread as a
command too, and a sequence waits for its adapter outside the scheduler until then.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from inferd.artifacts import read_manifest, template_tool_call_format, verify_artifact
from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats, EngineUnavailable, InvalidRequest
from inferd.engine.grammar import Grammars
from inferd.engine.grammar_worker import GrammarWorker
from inferd.engine.loading import run_load
from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import HFTokenizer
from inferd.engine.validation import failure_message, validate_request
from inferd.engine.reference.adapter_host import LoraHost
from inferd.engine.reference.admission import Admission
from inferd.engine.block_manager import BlockManager
from inferd.engine.reference.model import ForwardBatch, LlamaModel
from inferd.engine.reference.output import RequestOutput
from inferd.engine.reference.sampler import Sampler, grammar_masked, token_logprobs
from inferd.engine.scheduler import Scheduler
from inferd.engine.sequence import Sequence, prefix_salt
from inferd.observability import get_logger, request_context
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams

log = get_logger(__name__)
_EMA = 0.1


class ReferenceEngine(LoraHost, Admission, Engine):
    """`info` and `tokenizer` are set by start(). `step_observer` (see Engine) gets each step's wall
    time, on the step thread.

    LoRA (an AdapterHost, see adapter_host): `lora_adapters` maps adapter names to their directories
    (adapter_registry); a request naming one runs with it, loaded on first use, `max_loaded_adapters`
    at most loaded at once, each unloaded after `adapter_idle_unload_s` unused (None: until evicted).
    With `adapter_trusted_keys` (fingerprint -> .pub path) an adapter loads only if signed by one of them."""

    compiles_missed_grammars = True      # on its GrammarWorker, never on the step thread (admission)
    yields_slots = True

    def __init__(self, artifact_dir: Path, *, num_kv_blocks: int, block_size: int = 16, max_batch_size: int = 32,
                 max_num_tokens: int = 512, verify: bool = True, lora_adapters: Mapping[str, str | Path] | None = None,
                 max_loaded_adapters: int = 4, adapter_idle_unload_s: float | None = None,
                 adapter_trusted_keys: Mapping[str, str] | None = None, max_model_len: int | None = None) -> None:
        for name, value in (("num_kv_blocks", num_kv_blocks), ("block_size", block_size),
                            ("max_batch_size", max_batch_size), ("max_num_tokens", max_num_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.artifact_dir = Path(artifact_dir)
        self._num_kv_blocks, self._block_size = num_kv_blocks, block_size
        self._max_batch_size, self._max_num_tokens = max_batch_size, max_num_tokens
        self._verify = verify
        self._max_model_len = max_model_len      # None: the model's own context
        self._init_adapters(lora_adapters, max_loaded=max_loaded_adapters, idle_unload_s=adapter_idle_unload_s,
                            verify=verify, trusted=adapter_trusted_keys)
        self._cond = threading.Condition()
        self._commands: deque[tuple[str, object]] = deque()   # guarded by _cond
        self._pending_requests = 0       # submitted, not yet reflected in a snapshot (guarded by _cond)
        self._pending_blocks = 0
        self._pending_prompt_tokens = 0
        self._pending_yields = 0         # yield_slot()s the step thread has not applied yet (guarded by _cond)
        # Ids a yield_slot() was granted for and that have not resumed, or whose grammar compiles (not
        # scheduled yet, nothing to yield): a second yield would count a slot free that nothing frees.
        self._yielded: set[str] = set()  # guarded by _cond
        self._compiling: set[str] = set()  # guarded by _cond
        self._held_yields: list[str] = []  # loop thread; granted, not sent to the step thread yet
        # (free blocks for new work, running, waiting, prompt tokens not yet computed, parked, their blocks)
        self._snapshot = (num_kv_blocks, 0, 0, 0, 0, 0)
        self._used_blocks_snapshot = 0
        self._stop = False
        self._streams: dict[str, RequestStream] = {}           # loop thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._failed: str | None = None
        self._counters = dict(steps=0, prompt=0, generated=0, cached=0, parked=0)
        self._ema_latency = 0.0
        self._ema_tokens = 0.0

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        await run_load(self._load)       # low priority: versions already serving come first
        self._thread = threading.Thread(target=self._run, name=f"inferd-ref-{self.info.model_name}", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        manifest = verify_artifact(self.artifact_dir) if self._verify else read_manifest(self.artifact_dir)
        self.model = LlamaModel.from_pretrained(self.artifact_dir)
        self.tokenizer = HFTokenizer.from_dir(self.artifact_dir)
        config = self.model.config
        self.grammars = Grammars.for_hf(self.tokenizer, config.vocab_size)   # lazy: xgrammar loads on first use
        self._adapters.bind(config)
        # A sequence can never outgrow the whole KV pool: advertise that bound, or the API would
        # default max_tokens to a context this engine then refuses.
        max_model_len = min(config.max_position_embeddings, self._num_kv_blocks * self._block_size,
                            self._max_model_len or config.max_position_embeddings)
        self.info = EngineInfo(
            backend="reference", model_name=manifest.name, version=manifest.version,
            max_model_len=max_model_len, block_size=self._block_size,
            num_kv_blocks=self._num_kv_blocks, max_batch_size=self._max_batch_size,
            max_num_tokens=self._max_num_tokens, prefix_caching=True, hardware="cpu",
            tool_call_format=(manifest.tool_call_format or template_tool_call_format(self.tokenizer.chat_template)
                              or "hermes"))
        self._kv = self.model.new_kv_cache(self._num_kv_blocks, self._block_size)
        self._blocks = BlockManager(self._num_kv_blocks, self._block_size)
        self._scheduler = Scheduler(self._blocks, max_batch_size=self._max_batch_size,
                                    max_num_tokens=self._max_num_tokens, max_model_len=max_model_len,
                                    eos_token_ids=self.tokenizer.eos_token_ids)
        self._sampler = Sampler()
        self._seqs: dict[str, Sequence] = {}                    # step thread only
        self._grammar_worker = GrammarWorker(self.grammars)
        self._deferred: dict[str, Sequence] = {}     # step thread only: submitted, their grammar compiling

    async def warmup(self) -> None:
        """A multi-block prompt alongside short ones, through a few decode steps."""
        vocab = self.model.config.vocab_size
        limit = self.info.max_model_len      # a small KV pool makes it small
        shapes = [max(1, min(n, limit - 4)) for n in (3 * self._block_size + 1, 5, 9)]
        max_tokens = max(1, min(4, limit - max(shapes)))
        streams = [self.submit(GenerationRequest(
            request_id=f"__warmup_{i}_{id(self)}", tenant="__warmup__",
            prompt_token_ids=tuple((7 * j + i) % vocab for j in range(n)),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)))
            for i, n in enumerate(shapes)]
        await asyncio.gather(*(s.collect() for s in streams))

    async def close(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stop = True
            self._cond.notify()
        await asyncio.to_thread(thread.join)
        self._waits.close()
        self._grammar_worker.close()
        # deltas the thread handed over on its way out run before this continuation
        await asyncio.sleep(0)

    def memory_bytes(self) -> int:
        """What this version holds once loaded: its weights and its KV pool (what a memory budget counts)."""
        return self.model.weight_bytes() + sum(a.nbytes for a in (*self._kv.k, *self._kv.v))

    @property
    def num_preemptions(self) -> int:
        """Sequences preempted (and later recomputed) because the KV pool ran out, since start."""
        return self._scheduler.num_preemptions if self._thread is not None else 0

    @property
    def healthy(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and self._failed is None
                and not self._stop)

    # -- loop-thread API ---------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestStream:
        if not self.healthy:
            raise EngineUnavailable(self._failed or "the reference engine is not running")
        self._validate(request)
        stream = RequestStream(request.request_id, on_cancel=self.abort)
        seq = Sequence(request.request_id, request.prompt_token_ids, request.sampling,
                       salt=prefix_salt(request.tenant, request.lora), lora=request.lora, tenant=request.tenant,
                       weight=request.weight)
        seq.engine_state = RequestOutput(stream, time.monotonic())
        blocks = self._blocks.blocks_needed(len(request.prompt_token_ids))
        with self._cond:
            if self._failed is not None or self._stop:   # lost a race with the thread ending
                raise EngineUnavailable(self._failed or "the reference engine is closing")
            if self._held_yields:       # see yield_slot
                self._commands.extend(("yield", rid) for rid in self._held_yields)
                self._held_yields.clear()
            self._commands.append(("submit", seq))
            self._pending_requests += 1
            self._pending_blocks += blocks
            self._pending_prompt_tokens += len(request.prompt_token_ids)
            self._cond.notify()
        self._streams[request.request_id] = stream
        return stream

    def _validate(self, request: GenerationRequest) -> None:
        if request.request_id in self._streams:
            raise InvalidRequest(f"request id {request.request_id!r} is already in flight", "request_id")
        # max_model_len is already bounded by the KV pool (see _load): no separate capacity check
        validate_request(request, vocab_size=self.model.config.vocab_size, max_model_len=self.info.max_model_len)
        self._check_adapter(request)

    def yield_slot(self, request_id: str) -> bool:
        """Parked by the step thread before its next step; capacity() counts the slot free from now. False
        for one parked or already asked to yield (until it resumes) or whose grammar still compiles."""
        if request_id not in self._streams or self._thread is None:
            return False
        with self._cond:
            if request_id in self._yielded or request_id in self._compiling:
                return False
            self._yielded.add(request_id)
            self._pending_yields += 1
        # Held until the submit that follows it in this loop callback (admission's), so both reach the
        # step thread together: applied alone, the step thread could resume the parked sequence in the
        # free slot before the request it was yielded for arrives. Else sent on the loop's next turn.
        self._held_yields.append(request_id)
        if len(self._held_yields) == 1:
            asyncio.get_running_loop().call_soon(self._send_held_yields)
        return True

    def _send_held_yields(self) -> None:
        with self._cond:
            self._commands.extend(("yield", rid) for rid in self._held_yields)
            self._held_yields.clear()
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        if request_id in self._streams and self._thread is not None:
            with self._cond:
                self._commands.append(("abort", request_id))
                self._cond.notify()

    def capacity(self) -> Capacity:
        # The snapshot was taken after the last step; since then the step thread has only computed
        # (less pending prefill), while submissions it has not taken yet are added here in full.
        # A yield not applied yet frees its slot already: the request it was made for goes in after it.
        with self._cond:
            (free, running, waiting, prefill, parked, parked_blocks), pending, pending_blocks, pending_tokens = (
                self._snapshot, self._pending_requests, self._pending_blocks, self._pending_prompt_tokens)
            yields = self._pending_yields
        free = max(0, free - pending_blocks)
        waiting += pending
        return Capacity(free_kv_blocks=free, free_kv_tokens=free * self._block_size,
                        free_slots=max(0, self._max_batch_size - running - waiting + yields), waiting=waiting,
                        block_size=self._block_size, pending_prefill_tokens=prefill + pending_tokens,
                        parked=parked + yields, parked_kv_blocks=parked_blocks)

    def stats(self) -> EngineStats:
        with self._cond:
            (_, running, waiting, _, parked, _), c = self._snapshot, dict(self._counters)
            used, latency, tokens = self._used_blocks_snapshot, self._ema_latency, self._ema_tokens
            waiting += self._pending_requests + parked
        return EngineStats(
            running=running, waiting=waiting, kv_blocks_total=self._num_kv_blocks,
            kv_blocks_used=used, prefix_cache_hit_rate=c["cached"] / c["prompt"] if c["prompt"] else 0.0,
            step_latency_s=latency, steps_total=c["steps"], prompt_tokens_total=c["prompt"],
            generation_tokens_total=c["generated"], prefix_cache_hit_tokens_total=c["cached"],
            tokens_per_s=tokens / latency if latency > 0 else 0.0, fairness_preemptions_total=c["parked"])

    def _deliver(self, items: list[tuple[RequestStream, Delta]]) -> None:
        for stream, delta in items:
            if delta is None:           # see _resumed
                stream.resumed()
                continue
            stream.push(delta)
            if delta.finish_reason is not None and self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]
                with self._cond:     # an id may be used again once its stream ended
                    self._yielded.discard(stream.request_id)
                    self._compiling.discard(stream.request_id)

    # -- step thread -------------------------------------------------------------------
    def _run(self) -> None:
        deltas: list[tuple[RequestStream, Delta]] = []
        commands: list[tuple[str, object]] = []    # this round's, taken off the queue: only here now
        try:
            while True:
                with self._cond:
                    # a held adapter with a free slot is work too: _apply's retry installs it
                    while not (self._commands or self._stop or self._scheduler.has_work()
                               or self._waits.can_retry):
                        self._cond.wait(self._adapters.idle_wait())
                        self._adapters.unload_idle()
                    commands = list(self._commands)
                    self._commands.clear()
                    stop = self._stop
                taken = self._apply(commands, deltas)
                self._adapters.unload_idle()
                if stop:
                    for seq in list(self._seqs.values()):
                        self._end(seq, FinishReason.ABORT, deltas)
                    for seq in self._deferred.values():        # their grammar still compiling
                        self._taken(seq, taken)
                        self._final(seq, FinishReason.ABORT, deltas)
                    self._deferred.clear()
                elif self._scheduler.has_work():
                    self._step(deltas)
                    self._retry_held_adapters()   # sequences that finished may have freed a slot
                self._publish(taken)
                self._hand_over(deltas)
                deltas = []
                if stop:
                    return
        except BaseException:  # the thread must not die silently
            with self._cond:
                self._failed = "the reference engine failed; see server logs"
                queued = [seq for kind, seq in self._commands if kind == "submit"]
                self._commands.clear()
            # Every request the thread knew of ends: running ones, this round's commands (taken off
            # the queue, perhaps not applied yet) and those still queued. A stream ignores a second
            # final, so one that ended earlier this round keeps its own.
            taken = [seq for kind, seq in commands if kind == "submit"]
            failed = {id(seq): seq for seq in [*self._seqs.values(), *self._deferred.values(), *taken, *queued]}
            log.exception("reference_engine_thread_failed", request_ids=[s.request_id for s in failed.values()])
            for seq in failed.values():
                out: RequestOutput = seq.engine_state
                deltas.append((out.stream, out.final(seq, FinishReason.ERROR, time.monotonic(),
                                                     failure_message(seq.request_id))))
            self._seqs.clear()
            self._deferred.clear()
            self._hand_over(deltas)

    def _apply(self, commands, deltas) -> list[int]:
        taken = [0, 0, 0, 0]     # requests, blocks, prompt tokens, yields no longer pending (_publish subtracts)
        for kind, arg in commands:
            if kind == "submit":
                if self._begin(arg, deltas):     # else its grammar compiles first: still pending
                    self._taken(arg, taken)  # type: ignore[arg-type]
            elif kind == "compiled":
                seq, compiled = arg  # type: ignore[misc]
                if self._deferred.get(seq.request_id) is seq:     # else aborted while it compiled
                    del self._deferred[seq.request_id]
                    with self._cond:
                        self._compiling.discard(seq.request_id)
                    self._taken(seq, taken)
                    self._compiled(seq, compiled, deltas)
            elif kind == "adapter":
                self._adapter_read(*arg, deltas)  # type: ignore[misc]
            elif kind == "yield":
                taken[3] += 1
                seq = self._seqs.get(arg)  # type: ignore[arg-type]
                if seq is not None and self._scheduler.park(seq):
                    self._counters["parked"] += 1
                else:       # it ended (or never started) meanwhile: nothing was freed, tell admission
                    self._resumed(arg, seq, deltas)  # type: ignore[arg-type]
            elif (parked := self._deferred.pop(arg, None)) is not None:  # type: ignore[arg-type]
                with self._cond:
                    self._compiling.discard(parked.request_id)
                self._taken(parked, taken)
                self._final(parked, FinishReason.ABORT, deltas)     # aborted before it ever started
            else:
                seq = self._seqs.get(arg)  # type: ignore[arg-type]
                if seq is not None:
                    self._end(seq, FinishReason.ABORT, deltas)
        self._retry_held_adapters()
        return taken

    def _resumed(self, request_id: str, seq: Sequence | None, deltas) -> None:
        """`request_id` holds a slot again (or its yield was not applied): yieldable again; its stream is told."""
        with self._cond:
            self._yielded.discard(request_id)
        if seq is not None:
            deltas.append((seq.engine_state.stream, None))

    def _end(self, seq: Sequence, reason: FinishReason, deltas, error: str | None = None) -> None:
        if not self._waits.discard(seq, reason):
            self._scheduler.finish(seq, reason)
        self._waits.release(seq)
        self._seqs.pop(seq.request_id, None)
        out: RequestOutput = seq.engine_state
        deltas.append((out.stream, out.final(seq, reason, time.monotonic(), error)))

    def _step(self, deltas) -> None:
        started = time.monotonic()
        sched = self._scheduler
        out = sched.schedule()
        for seq in out.resumed:
            self._resumed(seq.request_id, seq, deltas)
        if out.empty:
            # submit() only admits requests that fit an empty pool, so this means a bug; failing
            # the head beats spinning on it forever
            if (sched.waiting or sched.parked) and not sched.running:
                head = (sched.waiting or sched.parked)[0]
                with request_context(head.request_id):
                    log.error("request_cannot_be_scheduled", prompt_tokens=head.num_prompt_tokens,
                              free_blocks=self._blocks.num_free_blocks)
                self._end(head, FinishReason.ERROR, deltas, failure_message(head.request_id))
            return
        for seq in out.seqs:
            if seq.engine_state.first_scheduled is None:
                seq.engine_state.first_scheduled = started
                self._counters["prompt"] += seq.num_prompt_tokens
                self._counters["cached"] += seq.num_cached_tokens
        batch = ForwardBatch(token_ids=out.token_ids, positions=out.positions, slot_mapping=out.slot_mapping,
                             query_lens=out.num_new_tokens, context_lens=out.context_lens,
                             block_tables=out.block_tables, loras=[seq.lora for seq in out.seqs])
        rows = out.sample_rows
        try:
            for src, dst in out.block_copies:       # forked sequences' partial blocks, before they are read
                self._kv.copy_block(src, dst)
            logits = self._forward(out, batch)
            if len(rows) != len(out.seqs):
                logits = logits[rows]
            picked = [out.seqs[r] for r in rows]
            logits = grammar_masked(logits, picked)
            sampled = self._sampler.sample(logits, [s.sampling for s in picked],
                                           [s.rng for s in picked], picked)
            for seq, token in zip(picked, sampled):
                if seq.grammar is not None:
                    seq.grammar.accept(token)
            wanted = [j for j, s in enumerate(picked) if s.sampling.logprobs is not None]
            if wanted:      # only the rows that asked pay for log_softmax (a grammar's mask included, as vLLM)
                found = token_logprobs(logits[wanted], [sampled[j] for j in wanted],
                                       [picked[j].sampling.logprobs for j in wanted])
                for j, lp in zip(wanted, found):
                    picked[j].engine_state.pending_logprob = lp
        except Exception:
            log.exception("engine_step_failed", request_ids=[seq.request_id for seq in out.seqs])
            for seq in out.seqs:
                self._end(seq, FinishReason.ERROR, deltas, failure_message(seq.request_id))
            return
        now = time.monotonic()
        for seq in sched.update_from_output(out, sampled):
            out_state: RequestOutput = seq.engine_state
            delta, stop_string = out_state.on_token(seq, now)
            if stop_string and not seq.finished:
                sched.finish(seq, FinishReason.STOP)
            if seq.finished:
                self._seqs.pop(seq.request_id, None)
                self._waits.release(seq)
            deltas.append((out_state.stream, delta))
        self._counters["steps"] += 1
        self._counters["generated"] += len(sampled)
        elapsed = now - started
        observer = self.step_observer
        if observer is not None:
            try:
                observer(elapsed)
            except Exception:  # metrics must never take the engine down
                log.exception("step_observer_failed")
        first = self._ema_latency == 0.0
        self._ema_latency = elapsed if first else (1 - _EMA) * self._ema_latency + _EMA * elapsed
        self._ema_tokens = out.num_tokens if first else (1 - _EMA) * self._ema_tokens + _EMA * out.num_tokens

    def _forward(self, out, batch: ForwardBatch):
        """The step's logits; sequences that want prompt log-probabilities and are still in their prompt
        also get the logits at every prompt position of this chunk (only they pay the LM head there)."""
        every = [i for i, seq in enumerate(out.seqs) if seq.sampling.prompt_logprobs is not None
                 and seq.num_computed_tokens < seq.num_prompt_tokens - 1]
        if not every:
            return self.model.forward(batch, self._kv)
        logits, full = self.model.forward_every(batch, self._kv, every)
        for i, chunk in zip(every, full):
            seq = out.seqs[i]
            seq.engine_state.prompt_logits(seq, seq.num_computed_tokens, chunk)
        return logits

    def _publish(self, taken: list[int]) -> None:
        sched, blocks_needed = self._scheduler, self._blocks.blocks_needed
        waiting = [*sched.waiting, *self._waits.waiting()]     # the latter wait for their adapter
        reserved = sum(blocks_needed(s.num_tokens) for s in waiting)
        # Prefill still to compute: waiting contexts (new or preempted) and running sequences with
        # more than a decode's one uncomputed token (chunked prefill, recompute).
        prefill = sum(s.num_tokens - s.num_computed_tokens for s in waiting)
        for s in sched.running:
            left = s.num_tokens - s.num_computed_tokens
            if left > 1 or not s.num_completion_tokens:
                prefill += left
        parked = (len(sched.parked), sum(blocks_needed(s.num_tokens) for s in sched.parked))
        snapshot = (max(0, self._blocks.num_free_blocks - reserved), len(sched.running), len(waiting), prefill, *parked)
        with self._cond:
            self._snapshot = snapshot
            self._used_blocks_snapshot = self._blocks.num_used_blocks
            self._pending_requests -= taken[0]
            self._pending_blocks -= taken[1]
            self._pending_prompt_tokens -= taken[2]
            self._pending_yields -= taken[3]

    def _hand_over(self, deltas) -> None:
        if not deltas or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._deliver, deltas)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            log.warning("event_loop_closed", dropped_deltas=len(deltas))

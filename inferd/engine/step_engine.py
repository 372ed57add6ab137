"""StepEngine: a model runner behind continuous batching, on its own step thread (the shared half of
the reference and torch engines).

The event loop only enqueues commands (submit, abort) and receives each step's deltas in one
`call_soon_threadsafe`. The step thread (step_thread) owns the scheduler, the runner and every Sequence:
take commands -> schedule -> run the model (forward, sample) -> update -> detokenize -> publish a
capacity snapshot -> hand the deltas to the loop. It sleeps on a Condition when there is nothing to do.
LoRA adapters (adapter_host) load on a loader thread; a finished load reaches the step thread as a
command too, and a sequence waits for its adapter outside the scheduler until then.
A backend subclasses it with `backend`, `hardware` and `_make_runner` (inferd.engine.runner).
"""
from __future__ import annotations

import asyncio
import contextlib
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
from inferd.engine.validation import validate_request
from inferd.engine.reference.adapter_host import LoraHost
from inferd.engine.reference.admission import Admission
from inferd.engine.block_manager import BlockManager
from inferd.engine.reference.output import RequestOutput
from inferd.engine.runner import ModelRunner
from inferd.engine.scheduler import Scheduler
from inferd.engine.sequence import Sequence, prefix_salt
from inferd.engine.speculative import Speculation, Speculator, make_speculator
from inferd.engine.step_thread import StepThread
from inferd.types import Delta, GenerationRequest, SamplingParams


class StepEngine(StepThread, LoraHost, Admission, Engine):
    """`info`, `tokenizer` and `model` are set by start(). `step_observer` (see Engine) gets each step's wall
    time, on the step thread.

    LoRA (an AdapterHost, see adapter_host): `lora_adapters` maps adapter names to their directories
    (adapter_registry); a request naming one runs with it, loaded on first use, `max_loaded_adapters`
    at most loaded at once, each unloaded after `adapter_idle_unload_s` unused (None: until evicted).
    With `adapter_trusted_keys` (fingerprint -> .pub path) an adapter loads only if signed by one of them."""

    backend = ""                         # EngineInfo.backend
    compute_precision = "float32"        # EngineInfo.precision of an artifact that does not name its own
    compiles_missed_grammars = True      # on its GrammarWorker, never on the step thread (admission)
    yields_slots = True

    def __init__(self, artifact_dir: Path, *, num_kv_blocks: int | None, block_size: int = 16, max_batch_size: int = 32,
                 max_num_tokens: int = 512, verify: bool = True, lora_adapters: Mapping[str, str | Path] | None = None,
                 max_loaded_adapters: int = 4, adapter_idle_unload_s: float | None = None,
                 adapter_trusted_keys: Mapping[str, str] | None = None, max_model_len: int | None = None,
                 speculative: Speculation | None = None) -> None:
        for name, value in (("num_kv_blocks", 1 if num_kv_blocks is None else num_kv_blocks),   # None: sized at load
                            ("block_size", block_size),
                            ("max_batch_size", max_batch_size), ("max_num_tokens", max_num_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.artifact_dir = Path(artifact_dir)
        self._num_kv_blocks, self._block_size = num_kv_blocks, block_size
        self._max_batch_size, self._max_num_tokens = max_batch_size, max_num_tokens
        self._verify = verify
        self._max_model_len = max_model_len      # None: the model's own context
        self._speculation = speculative
        self._speculator: Speculator | None = None   # made at load (the drafter may be a model)
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
        self._snapshot = (num_kv_blocks or 0, 0, 0, 0, 0, 0)   # set again once the runner sized the pool
        self._used_blocks_snapshot = 0
        self._stop = False
        self._streams: dict[str, RequestStream] = {}           # loop thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._cpu_clock: int | None = None      # the step thread's CPU clock (its kernel thread's, not reused)
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
        self._thread = threading.Thread(target=self._run, name=f"inferd-{self.backend}-{self.info.model_name}",
                                        daemon=True)
        self._thread.start()
        with contextlib.suppress(OSError, AttributeError):     # no per-thread clocks on this platform
            self._cpu_clock = time.pthread_getcpuclockid(self._thread.ident)

    def _make_runner(self) -> ModelRunner:
        """Load the model and its KV storage (on the loader thread); sets `_num_kv_blocks` when it sizes the pool."""
        raise NotImplementedError

    @property
    def hardware(self) -> str:
        """EngineInfo.hardware: what the runner computes on."""
        raise NotImplementedError

    @property
    def model(self):
        """The runner's model (None before start or once a backend released it at close)."""
        runner = getattr(self, "_runner", None)
        return getattr(runner, "model", None)

    def _context_limit(self, config, num_kv_blocks: int | None) -> int:
        """The longest sequence served: the model's context, max_model_len when set, and the KV pool (a
        sequence can never outgrow the whole pool: advertised, or the API would default max_tokens to a
        context this engine then refuses)."""
        limit = min(config.max_position_embeddings, self._max_model_len or config.max_position_embeddings)
        return limit if num_kv_blocks is None else min(limit, num_kv_blocks * self._block_size)

    def _load(self) -> None:
        manifest = verify_artifact(self.artifact_dir) if self._verify else read_manifest(self.artifact_dir)
        self._runner = self._make_runner()
        self.tokenizer = HFTokenizer.from_dir(self.artifact_dir)
        config = self._runner.config
        self.grammars = Grammars.for_hf(self.tokenizer, config.vocab_size)   # lazy: xgrammar loads on first use
        self._adapters.bind(config)
        max_model_len = self._context_limit(config, self._num_kv_blocks)
        self.info = EngineInfo(
            backend=self.backend, model_name=manifest.name, version=manifest.version,
            max_model_len=max_model_len, block_size=self._block_size,
            num_kv_blocks=self._num_kv_blocks, max_batch_size=self._max_batch_size,
            max_num_tokens=self._max_num_tokens, prefix_caching=True, hardware=self.hardware,
            tool_call_format=(manifest.tool_call_format or template_tool_call_format(self.tokenizer.chat_template)
                              or "hermes"),
            precision=str(manifest.build.get("precision") or self.compute_precision))
        self._snapshot = (self._num_kv_blocks, 0, 0, 0, 0, 0)
        self._blocks = BlockManager(self._num_kv_blocks, self._block_size)
        self._scheduler = Scheduler(self._blocks, max_batch_size=self._max_batch_size,
                                    max_num_tokens=self._max_num_tokens, max_model_len=max_model_len,
                                    eos_token_ids=self.tokenizer.eos_token_ids)
        if self._speculation is not None:
            self._speculator = make_speculator(self._speculation, self, max_model_len)
        self._seqs: dict[str, Sequence] = {}                    # step thread only
        self._grammar_worker = GrammarWorker(self.grammars)
        self._deferred: dict[str, Sequence] = {}     # step thread only: submitted, their grammar compiling

    async def warmup(self) -> None:
        """A multi-block prompt alongside short ones, through a few decode steps."""
        vocab = self._runner.config.vocab_size
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
        return self._runner.memory_bytes()

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
            raise EngineUnavailable(self._failed or f"the {self.backend} engine is not running")
        self._validate(request)
        stream = RequestStream(request.request_id, on_cancel=self.abort)
        seq = Sequence(request.request_id, request.prompt_token_ids, request.sampling,
                       salt=prefix_salt(request.tenant, request.lora), lora=request.lora, tenant=request.tenant,
                       weight=request.weight)
        seq.engine_state = RequestOutput(stream, time.monotonic())
        blocks = self._blocks.blocks_needed(len(request.prompt_token_ids))
        with self._cond:
            if self._failed is not None or self._stop:   # lost a race with the thread ending
                raise EngineUnavailable(self._failed or f"the {self.backend} engine is closing")
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
        validate_request(request, vocab_size=self._runner.config.vocab_size, max_model_len=self.info.max_model_len)
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
            tokens_per_s=tokens / latency if latency > 0 else 0.0, fairness_preemptions_total=c["parked"],
            speculation=self._speculator.stats() if self._speculator is not None else None,
            step_cpu_seconds_total=self._step_cpu_s())

    def _step_cpu_s(self) -> float | None:
        """The step thread's CPU time since it started (read from another thread through its CPU clock); None
        once it has exited (its clock is gone) or where there is none."""
        if self._thread is None:
            return 0.0
        if self._cpu_clock is None:
            return None
        try:
            return time.clock_gettime(self._cpu_clock)
        except OSError:
            return None

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


"""The fake C++ executor: in-flight batching in a background thread, like the real worker.

Scheduling follows the real capacity scheduler's GUARANTEED_NO_EVICT rule (start a request only if
the blocks it needs to complete fit beside what running requests still need), FCFS, up to
max_batch_size; each iteration spends at most max_num_tokens (generation tokens first, then context
chunks). Responses and iteration stats go back through the same queues the real proxy uses.
"""
from __future__ import annotations

import collections
import hashlib
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..bindings.executor import RequestPerfMetrics, TimingMetrics
from ..executor.utils import ErrorResponse
from .controls import controls
from .kv_pool import KvPool, block_hashes


@dataclass
class Response:
    request_id: int
    output_token_ids: list[int]
    finish_reason: str | None = None
    is_final: bool = False
    stop_words_hit: bool = False
    sequence_index: int = 0
    decoding_iter: int = 0
    cached_tokens: int = 0
    perf_metrics: RequestPerfMetrics | None = None


@dataclass
class _Fatal:
    """Wakes one waiting result so it surfaces the executor's fatal error."""


@dataclass
class _Active:
    request: object
    result: object
    max_tokens: int
    end_id: int
    stop_words: list[list[int]]
    greedy: bool
    seed: int
    hashes: list[bytes] = field(default_factory=list)
    held: list[bytes] = field(default_factory=list)
    private: int = 0
    computed: int = 0          # prompt tokens already in the KV cache (reused or prefilled)
    output: list[int] = field(default_factory=list)
    blocks_to_complete: int = 0
    cached_tokens: int = 0
    iters: int = 0
    arrival: float = 0.0                   # steady-clock stamps for RequestPerfMetrics
    first_scheduled: float = 0.0
    first_token: float = 0.0
    first_iter: int | None = None
    matcher: object = None                 # its grammar's xgrammar matcher (guided decoding)


class FakeModel:
    """Deterministic next-token function over the tokenizer's ordinary (non-special) tokens."""

    def __init__(self, candidates: list[int]) -> None:
        self.candidates = candidates

    def next_token(self, context: list[int], greedy: bool, seed: int, n_generated: int, bias=None,
                   allowed=None) -> int:
        # Its logits are flat, so an embedding_bias with a positive entry decides the token: its largest
        # (lowest id on a tie), as the penalty kernel adds the bias to the logits before sampling.
        if bias is not None and float(bias.max()) > 0:
            return int(bias.argmax())
        key = (tuple(context[-4:]), len(context)) if greedy else (tuple(context[-4:]), len(context), seed)
        h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")
        pool = self.candidates
        if allowed is not None:      # a grammar's mask: flat logits, so any token it allows, the end token too
            pool = [int(t) for t in allowed.nonzero()[0]]
        return pool[h % len(pool)]


class FakeExecutor:
    def __init__(self, *, model: FakeModel, guided=None, vocab_size: int, max_batch_size: int, max_num_tokens: int, max_seq_len: int,
                 max_input_len: int, num_blocks: int, tokens_per_block: int, enable_block_reuse: bool,
                 enable_chunked_context: bool, lora_enabled: bool, error_handler_owner) -> None:
        self.model = model
        self.guided = guided               # _double.guided.GuidedDecoder, when built with guided decoding
        self.vocab_size = vocab_size
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.max_seq_len = max_seq_len
        self.max_input_len = max_input_len
        self.chunked = enable_chunked_context
        self.lora_enabled = lora_enabled
        self.pool = KvPool(num_blocks, tokens_per_block, enable_block_reuse)
        self._owner = error_handler_owner
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: collections.deque[_Active] = collections.deque()
        self._active: list[_Active] = []
        self._results: dict[int, object] = {}
        self._stats_ring: collections.deque[str] = collections.deque(maxlen=1000)
        self._stats_lock = threading.Lock()
        self.iteration_result = None   # set by the LLM on the first generate_async
        self.error_queue: queue.Queue = queue.Queue()
        self._shutdown = threading.Event()
        self._iter = 0
        self._next_id = 1
        self._thread = threading.Thread(target=self._run, name="double-executor", daemon=True)
        self._stats_thread = threading.Thread(target=self._dispatch_stats, name="double-stats", daemon=True)
        self._thread.start()
        self._stats_thread.start()

    # -- proxy side (caller's thread) -------------------------------------------------
    def is_shutdown(self) -> bool:
        return self._shutdown.is_set()

    def new_request_id(self) -> int:
        rid, self._next_id = self._next_id, self._next_id + 1
        return rid

    def submit(self, request, result) -> None:
        self._results[request.id] = result
        self._inbox.put(("enqueue", request, result))

    def abort_request(self, request_id: int) -> None:
        self._inbox.put(("cancel", request_id, None))

    def shutdown(self) -> None:
        self._shutdown.set()
        self._inbox.put(("stop", None, None))
        for t in (self._thread, self._stats_thread):
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout=5)

    # -- worker side (background thread) ------------------------------------------------
    def _respond(self, result, item) -> None:
        result.queue.put(item)

    def _run(self) -> None:
        try:
            while not self._shutdown.is_set():
                idle = not self._waiting and not self._active
                try:
                    cmd = self._inbox.get(timeout=0.05) if idle else self._inbox.get_nowait()
                except queue.Empty:
                    cmd = None
                while cmd is not None:
                    if cmd[0] == "stop":
                        return
                    self._command(cmd)
                    try:
                        cmd = self._inbox.get_nowait()
                    except queue.Empty:
                        cmd = None
                if controls.crash_with is not None:
                    exc, controls.crash_with = controls.crash_with, None
                    raise exc
                self._iteration()
        except BaseException as exc:  # the worker died: the proxy records it and wakes one waiter
            self.error_queue.put(exc)
            self._shutdown.set()
            pending = [a.result for a in self._active] + [a.result for a in self._waiting]
            if pending:
                self._respond(pending[0], _Fatal())

    def _command(self, cmd) -> None:
        kind, payload, result = cmd
        if kind == "enqueue":
            self._enqueue(payload, result)
        elif kind == "cancel":
            for group in (self._waiting, self._active):
                for a in list(group):
                    if a.request.id == payload:
                        group.remove(a)
                        # The contract does not confirm that 'cancelled' reaches the request's queue.
                        self._finish(a, "cancelled", [], respond=not controls.drop_cancel_replies)

    def _enqueue(self, request, result) -> None:
        sp = request.sampling_params
        error = None
        if controls.fail_next_requests > 0:
            controls.fail_next_requests -= 1
            error = "injected request failure"
        elif len(request.prompt_token_ids) > self.max_input_len:
            error = (f"Prompt length ({len(request.prompt_token_ids)}) exceeds maximum input length "
                     f"({self.max_input_len}).")
        elif request.lora_request is not None and not self.lora_enabled:
            error = "LoRA is not enabled in this engine (build it with --lora_plugin)"
        else:
            try:
                sp._check_sampling_config()
                self._check_embedding_bias(sp.embedding_bias)
            except RuntimeError as exc:
                error = str(exc)
        if error is not None:
            self._results.pop(request.id, None)
            self._respond(result, ErrorResponse(request.id, error, request.id))
            return
        prompt_len = len(request.prompt_token_ids)
        max_tokens = min(sp.max_tokens, self.max_seq_len - prompt_len)   # _deduce_max_tokens clips
        greedy = sp._greedy_decoding   # the LLM API's rule; temperature plays no part in it
        end_id = -1 if sp.ignore_eos else sp.end_id
        stop_words = [[i] for i in (sp.stop_token_ids or [])] + list(sp._stop_word_ids or [])
        a = _Active(request, result, max(max_tokens, 1), end_id, stop_words, greedy, sp.seed or 0)
        a.hashes = block_hashes(list(request.prompt_token_ids), self.pool.tokens_per_block, request.cache_salt)
        a.blocks_to_complete = self.pool.blocks_for(prompt_len + a.max_tokens)
        a.arrival = time.monotonic()
        self._waiting.append(a)

    def _check_embedding_bias(self, bias) -> None:
        """SamplingParams documents embedding_bias as a kFP32 tensor of shape [vocab_size]; the executor
        reads vocab_size values of it, so anything else fails the request at enqueue."""
        if bias is None:
            return
        if str(getattr(bias, "dtype", "")) != "torch.float32" or tuple(getattr(bias, "shape", ())) != (self.vocab_size,):
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: embeddingBias must be a kFP32 tensor of "
                               f"shape [{self.vocab_size}]")

    def _remaining_blocks(self, a: _Active) -> int:
        return a.blocks_to_complete - len(a.held) - a.private

    def _schedule(self) -> None:
        reserved = sum(self._remaining_blocks(a) for a in self._active)
        while self._waiting and len(self._active) < self.max_batch_size:
            a = self._waiting[0]
            in_use, _ = self.pool.matched(a.hashes)
            if self.pool.free - reserved < a.blocks_to_complete - in_use:
                break   # FCFS: the head waits for room, nothing jumps it
            self._waiting.popleft()
            reused, a.held, a.private = self.pool.acquire_prompt(a.hashes)
            a.computed = reused * self.pool.tokens_per_block
            a.cached_tokens = a.computed
            a.first_scheduled, a.first_iter = time.monotonic(), self._iter
            guide = a.request.sampling_params.guided_decoding
            if guide is not None and self.guided is not None:   # compiled in the step, as guidedDecoder.cpp
                a.matcher = self.guided.matcher(guide)
            self._active.append(a)
            reserved += self._remaining_blocks(a)

    def _ensure_blocks(self, a: _Active, num_tokens: int) -> None:
        need = self.pool.blocks_for(num_tokens) - len(a.held) - a.private
        if need > 0:
            self.pool.acquire_private(need)
            a.private += need

    def _iteration(self) -> None:
        self._schedule()
        if not self._active:
            return
        started = time.monotonic()
        budget = self.max_num_tokens
        gen = [a for a in self._active if a.computed >= len(a.request.prompt_token_ids)]
        ctx = [a for a in self._active if a.computed < len(a.request.prompt_token_ids)]
        produced: list[_Active] = []
        for a in gen:
            if budget <= 0:
                break
            budget -= 1
            produced.append(a)
        ctx_tokens = 0
        ctx_scheduled = 0
        for a in ctx:
            remaining = len(a.request.prompt_token_ids) - a.computed
            if budget <= 0 or (not self.chunked and remaining > budget):
                continue
            chunk = min(remaining, budget)
            self._embed(a.request.prompt_token_ids[a.computed:a.computed + chunk])
            budget -= chunk
            ctx_tokens += chunk
            ctx_scheduled += 1
            a.computed += chunk
            self._ensure_blocks(a, a.computed)
            if a.computed == len(a.request.prompt_token_ids):
                produced.append(a)
        if controls.step_time_s:
            time.sleep(controls.step_time_s)
        for a in produced:
            self._decode_one(a)
        self._iter += 1
        self._record_stats(started, len(gen), ctx_scheduled, ctx_tokens)

    def _embed(self, token_ids) -> None:
        # The executor does not check ids: the embedding lookup reads out of bounds on the GPU, and a
        # CUDA error is fatal to the whole executor, not to one request.
        if any(not 0 <= t < self.vocab_size for t in token_ids):
            raise RuntimeError("[TensorRT-LLM][ERROR] CUDA runtime error in embeddingLookup: an illegal memory "
                               "access was encountered")

    def _decode_one(self, a: _Active) -> None:
        context = list(a.request.prompt_token_ids) + a.output
        n = len(a.output)
        if controls.eos_after is not None and n + 1 >= controls.eos_after and a.end_id != -1:
            token = a.end_id
        else:
            allowed = self.guided.allowed(a.matcher) if a.matcher is not None else None
            token = self.model.next_token(context, a.greedy, a.seed, n, a.request.sampling_params.embedding_bias,
                                          allowed)
            if a.matcher is not None:
                a.matcher.accept_token(token)
        a.iters += 1
        if not a.first_token:
            a.first_token = time.monotonic()
        if token == a.end_id:
            self._finish(a, "stop", [])
            return
        a.output.append(token)
        self._ensure_blocks(a, len(context) + 1)
        stop_hit = any(a.output[-len(w):] == w for w in a.stop_words if w)
        if stop_hit:
            self._finish(a, "stop", [token], stop_words_hit=True)
        elif len(a.output) >= a.max_tokens:
            self._finish(a, "length", [token])
        elif a.request.streaming:
            self._respond(a.result, Response(a.request.id, [token], decoding_iter=a.iters,
                                             cached_tokens=a.cached_tokens))

    def _finish(self, a: _Active, reason: str, new_tokens: list[int], stop_words_hit: bool = False,
                respond: bool = True) -> None:
        if a in self._active:
            self._active.remove(a)
        self.pool.release(a.held, a.private)
        a.held, a.private = [], 0
        tokens = new_tokens if a.request.streaming else list(a.output)
        if not a.request.streaming and reason == "cancelled":
            tokens = []
        self._results.pop(a.request.id, None)
        if not respond:
            return
        self._respond(a.result, Response(a.request.id, tokens, reason, True, stop_words_hit,
                                         decoding_iter=a.iters, cached_tokens=a.cached_tokens,
                                         perf_metrics=self._perf_metrics(a)))

    def _perf_metrics(self, a: _Active) -> RequestPerfMetrics | None:
        if not (controls.perf_metrics and a.request.sampling_params.return_perf_metrics):
            return None
        def steady(t: float) -> timedelta:
            return timedelta(seconds=t) if t else timedelta(0)
        last = time.monotonic()
        return RequestPerfMetrics(
            timing_metrics=TimingMetrics(arrival_time=steady(a.arrival), first_scheduled_time=steady(a.first_scheduled),
                                         first_token_time=steady(a.first_token), last_token_time=steady(last)),
            first_iter=a.first_iter, last_iter=self._iter)

    def _record_stats(self, started: float, num_gen: int, num_ctx: int, ctx_tokens: int) -> None:
        item = {
            "timestamp": datetime.now().strftime("%m-%d-%Y %H:%M:%S"),
            "iter": self._iter,
            "iterLatencyMS": (time.monotonic() - started) * 1000.0,
            "newActiveRequestsQueueLatencyMS": 0.0,
            "numNewActiveRequests": num_ctx,
            "numActiveRequests": len(self._active),
            "numQueuedRequests": len(self._waiting),
            "numCompletedRequests": 0,
            "maxNumActiveRequests": self.max_batch_size,
            "maxBatchSizeStatic": self.max_batch_size,
            "maxBatchSizeTunerRecommended": 0,
            "maxBatchSizeRuntime": self.max_batch_size,
            "maxNumTokensStatic": self.max_num_tokens,
            "maxNumTokensTunerRecommended": 0,
            "maxNumTokensRuntime": self.max_num_tokens,
            "gpuMemUsage": 0, "cpuMemUsage": 0, "pinnedMemUsage": 0,
            "kvCacheStats": self.pool.stats(),
            "staticBatchingStats": None,
            "inflightBatchingStats": {
                "numScheduledRequests": num_gen + num_ctx, "numContextRequests": num_ctx,
                "numGenRequests": num_gen, "numPausedRequests": 0, "numCtxTokens": ctx_tokens,
                "microBatchId": 0, "avgNumDecodedTokensPerIter": 1.0 if num_gen else 0.0,
            },
            "specDecodingStats": None,
        }
        with self._stats_lock:
            self._stats_ring.append(json.dumps(item))

    def _dispatch_stats(self) -> None:
        while not self._shutdown.wait(controls.stats_poll_s):
            target = self.iteration_result
            if target is None:
                continue
            with self._stats_lock:
                items, self._stats_ring = list(self._stats_ring), collections.deque(maxlen=1000)
            for item in items:
                target.queue.put(item)

"""UnaryEngine: an Engine for one-shot models (embeddings), fed by a deadline-aware dynamic batcher.

Admission treats it like any engine: `capacity()` offers room for one batch that is still forming
(its size caps in requests and tokens), so whatever admission releases joins the next batch in the
fair order it was released, and the rest waits in admission where quotas, priorities and deadlines
apply. The batcher (a task on the loop) decides with inferd.engine.unary.policy when the forming
batch closes; the encoder runs it on one worker thread, never on the loop; each request's stream then
gets one final Delta carrying its vector (`Delta.embedding`) and its usage.

The backend supplies an `Encoder` (the reference model, the sim): blocking `encode(batch)` returning
pooled, L2-normalized float32 vectors, one per input, the same whatever else is in the batch.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats, EngineUnavailable, InvalidRequest, Tokenizer
from inferd.engine.stream import RequestStream
from inferd.engine.unary.compute_model import ComputeModel
from inferd.engine.unary.policy import Estimate, Limits, Pending
from inferd.types import Delta, EngineTiming, FinishReason, GenerationRequest, Usage

log = logging.getLogger("inferd.engine.unary")

_GAP_ALPHA = 0.1            # EWMA weight of a new inter-arrival gap


class Encoder(Protocol):
    tokenizer: Tokenizer
    dimensions: int
    max_model_len: int
    matryoshka_min_dimensions: int | None

    def encode(self, batch: Sequence[Sequence[int]]) -> np.ndarray: ...


class LoadedEncoder(NamedTuple):
    encoder: Encoder
    model_name: str
    version: str


class Policy(Protocol):
    name: str

    def plan(self, pending: Sequence[Pending], now: float, estimate: Estimate, limits: Limits,
             arrival_rate: float): ...


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch, as the batch observer (the daemon's metrics) sees it."""

    size: int                   # requests
    tokens: int
    fill: float                 # the larger of size / max requests and tokens / max tokens
    wait_s: float               # how long its oldest member waited for the batch to close
    compute_s: float
    late: int                   # members answered after their deadline


class _Request:
    __slots__ = ("pending", "prompt", "stream", "aborted")

    def __init__(self, pending: Pending, prompt: tuple[int, ...], stream: RequestStream) -> None:
        self.pending, self.prompt, self.stream = pending, prompt, stream
        self.aborted = False


class UnaryEngine(Engine):
    """One loaded embedding model version. Loop-thread only, except the encoder's worker."""

    def __init__(self, load: Callable[[], LoadedEncoder], policy: Policy, *, backend: str, max_batch_size: int,
                 max_batch_tokens: int, hardware: str, simulated: bool = False, prior: Estimate | None = None) -> None:
        for name, value in (("max_batch_size", max_batch_size), ("max_batch_tokens", max_batch_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self._load, self.policy = load, policy
        self._backend, self._hardware, self._simulated = backend, hardware, simulated
        self.limits = Limits(max_requests=max_batch_size, max_tokens=max_batch_tokens)
        self.compute = ComputeModel(prior)
        self.batch_observer: Callable[[BatchRecord], None] | None = None
        self.deadline_drop_observer: Callable[[int], None] | None = None
        self._requests: dict[str, _Request] = {}
        self._pending: list[Pending] = []
        self._pending_tokens = 0
        self._running: list[_Request] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._last_arrival: float | None = None
        self._mean_gap = float("inf")
        self._counters = dict(batches=0, prompt=0)
        self._last_compute_s = 0.0
        self._ema_tokens_per_s = 0.0

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"inferd-{self._backend}-embed")
        if getattr(self, "info", None) is None:
            self.adopt(await asyncio.get_running_loop().run_in_executor(self._executor, self._load))
        self._task = asyncio.get_running_loop().create_task(self._batcher(),
                                                            name=f"embed-batcher-{self.info.model_name}")

    def adopt(self, loaded: LoadedEncoder) -> None:
        """Take a loaded encoder: `start` does this with `load()`'s; a backend whose encoder costs nothing
        to make (the sim) does it at construction, so its info is known before start, as the sim's is."""
        enc = self.encoder = loaded.encoder
        self.tokenizer = enc.tokenizer
        # An input is at most a batch's tokens (max_num_tokens) as well as the model's context: the
        # forming batch is what admission sees as this engine's room, and a longer input would never fit.
        self.info = EngineInfo(
            backend=self._backend, model_name=loaded.model_name, version=loaded.version,
            max_model_len=min(enc.max_model_len, self.limits.max_tokens), block_size=1,
            num_kv_blocks=self.limits.max_tokens,
            max_batch_size=self.limits.max_requests, max_num_tokens=self.limits.max_tokens,
            simulated=self._simulated, hardware=self._hardware, task="embed", dimensions=enc.dimensions,
            min_dimensions=enc.matryoshka_min_dimensions)

    async def warmup(self) -> None:
        """Batches of 1, 2, 4, ... requests up to a full one, so the compute model has measured the
        shapes it will be asked about before the first request is batched by it."""
        loop = asyncio.get_running_loop()
        length = max(1, min(self.info.max_model_len, self.limits.max_tokens // self.limits.max_requests))
        sizes = sorted({min(1 << k, self.limits.max_requests)
                        for k in range(self.limits.max_requests.bit_length() + 1)})
        await loop.run_in_executor(self._executor, self._timed_encode, [[1] * length])   # cold: not measured
        for n in sizes:
            batch = [[(i + 7) % self.tokenizer.vocab_size] * length for i in range(n)]
            _, seconds = await loop.run_in_executor(self._executor, self._timed_encode, batch)
            self.compute.observe(n * length, seconds)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):     # the batcher's own failure was logged there
                pass
        for req in list(self._requests.values()):
            self._finish(req, Delta(token_ids=[], finish_reason=FinishReason.ABORT, usage=self._usage(req)))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closed

    # -- requests ----------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestStream:
        if not self.healthy:
            raise EngineUnavailable("the embedding engine is not running")
        n = len(request.prompt_token_ids)
        if n == 0:
            raise InvalidRequest("input: empty (tokenizes to nothing)", param="input")
        if n > self.info.max_model_len:
            raise InvalidRequest(f"input: {n} tokens; this model's context is {self.info.max_model_len} tokens",
                                 param="input")
        if request.request_id in self._requests:
            raise InvalidRequest(f"request id {request.request_id!r} is already in flight")
        now = time.monotonic()
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            self._mean_gap = gap if self._mean_gap == float("inf") else self._mean_gap + _GAP_ALPHA * (
                gap - self._mean_gap)
        self._last_arrival = now
        stream = RequestStream(request.request_id, on_cancel=self.abort)
        pending = Pending(request.request_id, n, now, request.deadline)
        self._requests[request.request_id] = _Request(pending, request.prompt_token_ids, stream)
        self._pending.append(pending)
        self._pending_tokens += n
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is None:
            return
        if req.pending in self._pending:        # still forming: leaves the batch-to-be
            self._pending.remove(req.pending)
            self._pending_tokens -= req.pending.tokens
            self._wake.set()
        req.aborted = True
        self._finish(req, Delta(token_ids=[], finish_reason=FinishReason.ABORT, usage=self._usage(req)))

    def arrival_rate(self, now: float) -> float:
        """Requests per second lately (0 before two have arrived); decays while none arrive."""
        if self._last_arrival is None or self._mean_gap == float("inf"):
            return 0.0
        return 1.0 / max(self._mean_gap, now - self._last_arrival, 1e-6)

    def capacity(self) -> Capacity:
        """Room in the batch that is forming: admission releases into it and holds the rest."""
        free_tokens = max(0, self.limits.max_tokens - self._pending_tokens)
        return Capacity(free_kv_blocks=free_tokens, free_kv_tokens=free_tokens,
                        free_slots=max(0, self.limits.max_requests - len(self._pending)), waiting=0, block_size=1)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._running), waiting=len(self._pending),
                           kv_blocks_total=self.limits.max_tokens, kv_blocks_used=min(self._pending_tokens,
                                                                                      self.limits.max_tokens),
                           prefix_cache_hit_rate=0.0, step_latency_s=self._last_compute_s,
                           steps_total=self._counters["batches"], prompt_tokens_total=self._counters["prompt"],
                           generation_tokens_total=0, prefix_cache_hit_tokens_total=0,
                           tokens_per_s=self._ema_tokens_per_s)

    # -- the batcher -------------------------------------------------------------------
    async def _batcher(self) -> None:
        try:
            await self._batch_forever()
        except asyncio.CancelledError:
            raise
        except Exception:   # noqa: BLE001 — a bug: fail what is in flight rather than leave it hanging
            log.exception("embedding batcher failed", extra={"event": "embed_batcher_failed"})
            for req in list(self._requests.values()):
                self._finish(req, Delta(token_ids=[], finish_reason=FinishReason.ERROR, usage=self._usage(req),
                                        error="the engine failed"))
            self._pending.clear()
            self._pending_tokens = 0
            raise

    async def _batch_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = time.monotonic()
            plan = self.policy.plan(self._pending, now, self.compute.estimate, self.limits, self.arrival_rate(now))
            launch = [self._pending[i] for i in plan.launch]      # before the drops move the indices
            if plan.drop:
                self._drop_hopeless(plan.drop)
            if launch:
                taken = {id(p) for p in launch}
                self._pending = [p for p in self._pending if id(p) not in taken]
                batch = [self._requests[p.request_id] for p in launch]
                self._pending_tokens -= sum(p.tokens for p in launch)
                await self._run_batch(batch, now)
                continue
            self._wake.clear()
            timer = None if plan.wake_at is None else loop.call_at(
                loop.time() + max(0.0, plan.wake_at - time.monotonic()), self._wake.set)
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    def _drop_hopeless(self, indices: Sequence[int]) -> None:
        """Requests that cannot meet their deadline even if run now: answered at once (DEADLINE)
        instead of spending compute on an answer that would come too late."""
        dropped = [self._pending[i] for i in indices]
        gone = {id(p) for p in dropped}
        self._pending = [p for p in self._pending if id(p) not in gone]
        for p in dropped:
            self._pending_tokens -= p.tokens
            req = self._requests[p.request_id]
            self._finish(req, Delta(token_ids=[], finish_reason=FinishReason.DEADLINE, usage=self._usage(req)))
        self._notify(self.deadline_drop_observer, len(dropped))

    def _timed_encode(self, batch: Sequence[Sequence[int]]) -> tuple[np.ndarray, float]:
        started = time.perf_counter()
        vectors = self.encoder.encode(batch)
        return vectors, time.perf_counter() - started

    async def _run_batch(self, batch: list[_Request], closed_at: float) -> None:
        self._running = batch
        tokens = sum(r.pending.tokens for r in batch)
        started = time.monotonic()
        try:
            vectors, seconds = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._timed_encode, [r.prompt for r in batch])
            if len(vectors) != len(batch):
                raise RuntimeError(f"the encoder returned {len(vectors)} vectors for {len(batch)} inputs")
        except Exception:   # noqa: BLE001 — a bug or a bad input fails this batch, not the engine
            log.exception("embedding batch failed", extra={"event": "embed_batch_failed", "size": len(batch)})
            for req in batch:
                self._finish(req, Delta(token_ids=[], finish_reason=FinishReason.ERROR, usage=self._usage(req),
                                        error="the engine failed to compute this input"))
            return
        finally:
            self._running = []
        finished = time.monotonic()
        self.compute.observe(tokens, seconds)
        self._counters["batches"] += 1
        self._counters["prompt"] += tokens
        self._last_compute_s = seconds
        rate = tokens / seconds if seconds > 0 else 0.0
        self._ema_tokens_per_s = rate if not self._ema_tokens_per_s else self._ema_tokens_per_s + 0.1 * (
            rate - self._ema_tokens_per_s)
        late = 0
        for req, vector in zip(batch, vectors):
            p = req.pending
            late += p.deadline is not None and finished > p.deadline
            timing = EngineTiming(submitted=p.arrived, first_scheduled=started, finished=finished)
            self._finish(req, Delta(token_ids=[], finish_reason=FinishReason.STOP, usage=self._usage(req),
                                    timing=timing, embedding=vector))
        self._observe(BatchRecord(
            size=len(batch), tokens=tokens, compute_s=seconds, late=late,
            fill=max(len(batch) / self.limits.max_requests, tokens / self.limits.max_tokens),
            wait_s=max(0.0, closed_at - min(r.pending.arrived for r in batch))))

    def _observe(self, record: BatchRecord) -> None:
        self._notify(self.step_observer, record.compute_s)
        self._notify(self.batch_observer, record)

    @staticmethod
    def _notify(observer: Callable | None, value: object) -> None:
        if observer is not None:
            try:
                observer(value)
            except Exception:   # noqa: BLE001 — metrics never fail a batch
                log.exception("batch observer failed")

    def _finish(self, req: _Request, delta: Delta) -> None:
        if self._requests.pop(req.pending.request_id, None) is None:
            return                  # already answered (an abort racing the batch's end)
        req.stream.push(delta)

    @staticmethod
    def _usage(req: _Request) -> Usage:
        return Usage(prompt_tokens=req.pending.tokens, completion_tokens=0)

"""The TensorRT-LLM backend: a TensorRT engine directory served through the LLM API (1.2.x).

Written against /work/shared/trtllm-api.md and tested with tests/trtllm_double; see docs/gpu.md for
what has (not) run on a GPU. The rules that shape this module, all from the API contract:

- `tensorrt_llm._tensorrt_engine.LLM` (the TensorRT-engine backend), built off the loop in start().
- `generate_async` is called on the event-loop thread (its result queues bind to the running loop),
  with token ids, keyword arguments only, and always `max_tokens` (its default is 32).
- A `RequestOutput` is mutated in place; we keep our own offset of token ids already sent and
  detokenize ourselves (IncrementalDetokenizer + StopMatcher, as the other backends do), so no part
  of a stop string is ever streamed and text is identical across backends.
- Fairness lives in admission, so `capacity()` must keep the executor's own queue empty. With
  GUARANTEED_NO_EVICT the executor starts a request only when blocks for prompt + max_tokens fit;
  we count the same reservation for every request in flight and, while requests run, also take the
  executor's freeNumBlocks (from `get_stats_async`) minus what was submitted since that sample.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from inferd.artifacts import MANIFEST_FILE, ArtifactError, Manifest, read_manifest, verify_artifact
from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats, EngineUnavailable, InvalidRequest
from inferd.engine.stream import RequestStream
from inferd.engine.validation import seed64, validate_request
from inferd.tokenization import HFTokenizer, IncrementalDetokenizer, StopMatcher
from inferd.types import Delta, EngineTiming, FinishReason, GenerationRequest, SamplingParams, Usage

log = logging.getLogger("inferd.engine.trtllm")

INSTALL_HINT = ("TensorRT-LLM is not installed. On a GPU node (Linux x86_64/aarch64, Python 3.10 or 3.12, "
                "CUDA 13 driver): pip install 'inferd[trtllm]' --extra-index-url https://pypi.nvidia.com "
                "(see docs/gpu.md)")
SCHEDULER_POLICIES = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}
STATS_TIMEOUT_S = 2.0        # get_stats_async ends after this long without an iteration
ABORT_GRACE_S = 5.0          # how long an aborted request may take to report 'cancelled'
WARMUP_STATS_TIMEOUT_S = 5.0
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "timeout": FinishReason.DEADLINE,
           "cancelled": FinishReason.ABORT}


class TrtllmNotInstalled(EngineUnavailable):
    """`tensorrt_llm` cannot be imported here."""


def _import_trtllm() -> dict[str, Any]:
    try:
        from tensorrt_llm._tensorrt_engine import LLM
        from tensorrt_llm.llmapi import (CapacitySchedulerPolicy, KvCacheConfig, LoRARequest, RequestError,
                                         SamplingParams as TrtSamplingParams, SchedulerConfig)
    except ImportError as exc:
        raise TrtllmNotInstalled(f"{INSTALL_HINT} [import failed: {exc}]") from exc
    return dict(LLM=LLM, CapacitySchedulerPolicy=CapacitySchedulerPolicy, KvCacheConfig=KvCacheConfig,
                LoRARequest=LoRARequest, RequestError=RequestError, SamplingParams=TrtSamplingParams,
                SchedulerConfig=SchedulerConfig)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _seconds(value: Any) -> float:
    """A steady-clock stamp of the executor's perf metrics (timedelta in 1.2/1.3; tolerate a float)."""
    return value.total_seconds() if hasattr(value, "total_seconds") else float(value)


def _scheduled_at(r: "_Req", first_token: float) -> float:
    """When the request's prefill started, on our clock.

    The executor measures it (perf metrics, final response only) on its own steady clock, which may
    be another process's, so only its prefill duration (first token - first scheduled) is used, set
    back from our first-token stamp. Without metrics (not supported, not final yet, renamed
    attributes) prefill cannot be told from queueing: the stamp is the first token's.
    """
    try:
        timing = r.output.outputs[0].request_perf_metrics.timing_metrics
        scheduled, token = _seconds(timing.first_scheduled_time), _seconds(timing.first_token_time)
    except (AttributeError, IndexError, TypeError, ValueError):
        return first_token
    if not (scheduled > 0.0 and token >= scheduled):     # unset (zero) stamps, NaN
        return first_token
    return max(r.submitted, first_token - (token - scheduled))


class _Req:
    __slots__ = ("id", "stream", "output", "task", "prompt_len", "blocks", "seq", "sent", "emitted", "detok",
                 "matcher", "stopped", "aborting", "overdue", "submitted", "first_token", "cached", "ended",
                 "released")

    def __init__(self, request: GenerationRequest, stream: RequestStream, blocks: int, seq: int,
                 detok: IncrementalDetokenizer, matcher: StopMatcher | None) -> None:
        self.id = request.request_id
        self.stream = stream
        self.output: Any = None           # the RequestOutput
        self.task: asyncio.Task | None = None
        self.prompt_len = len(request.prompt_token_ids)
        self.blocks = blocks              # GUARANTEED_NO_EVICT reservation: prompt + max_tokens
        self.seq = seq                    # submission order, to compare with stats samples
        self.sent = 0                     # len(output.token_ids) already read
        self.emitted = 0                  # tokens handed to the client
        self.detok = detok
        self.matcher = matcher
        self.stopped = False              # a stop string matched: drop whatever comes after
        self.aborting = False             # cancelled in the executor; waiting for its 'cancelled'
        self.overdue: asyncio.TimerHandle | None = None
        self.submitted = time.monotonic()
        self.first_token: float | None = None
        self.cached = 0
        self.ended = False                # the client's stream has its final delta
        self.released = False             # no longer counted in capacity (the executor let it go)


class TrtllmEngine(Engine):
    """`step_observer`, when set (the daemon sets it), gets each executor iteration's wall time in
    seconds (`iterLatencyMS` of its stats sample), once per sample, on the event-loop thread."""

    step_observer: Callable[[float], None] | None = None

    def __init__(self, engine_dir: Path, *, tokenizer_dir: Path | None = None, max_batch_size: int | None = None,
                 max_num_tokens: int | None = None, kv_cache_free_gpu_memory_fraction: float | None = None,
                 kv_cache_max_tokens: int | None = None, enable_block_reuse: bool = True,
                 scheduler_policy: str = "guaranteed_no_evict", enable_chunked_prefill: bool = True,
                 lora_adapters: dict[str, str] | None = None, model_name: str | None = None,
                 version: str | None = None, verify: bool = True) -> None:
        if scheduler_policy not in SCHEDULER_POLICIES:
            raise ValueError(f"scheduler_policy must be one of {sorted(SCHEDULER_POLICIES)}, got {scheduler_policy!r}")
        if kv_cache_free_gpu_memory_fraction is not None and not 0 < kv_cache_free_gpu_memory_fraction < 1:
            raise ValueError("kv_cache_free_gpu_memory_fraction must be in (0, 1)")
        if kv_cache_max_tokens is not None and kv_cache_max_tokens <= 0:
            raise ValueError("kv_cache_max_tokens must be > 0")
        for name, value in (("max_batch_size", max_batch_size), ("max_num_tokens", max_num_tokens)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1")
        self.engine_dir = Path(engine_dir)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else self.engine_dir
        self._max_batch_size, self._max_num_tokens = max_batch_size, max_num_tokens
        self._kv_fraction, self._kv_max_tokens = kv_cache_free_gpu_memory_fraction, kv_cache_max_tokens
        self._block_reuse, self._policy, self._chunked = enable_block_reuse, scheduler_policy, enable_chunked_prefill
        self._lora_paths = dict(lora_adapters or {})
        self._model_name, self._version = model_name, version
        self._verify = verify
        self.info = EngineInfo(backend="trtllm", model_name=model_name or self.engine_dir.name,
                               version=version or "unknown", max_model_len=0, block_size=0, num_kv_blocks=0,
                               max_batch_size=0, max_num_tokens=0)
        self.tokenizer: HFTokenizer | None = None
        self._api: dict[str, Any] = {}
        self._llm: Any = None
        self._gen_params: frozenset[str] = frozenset()
        self._perf_metrics = False     # SamplingParams.return_perf_metrics exists (per-request timing)
        self._lora: dict[str, Any] = {}
        self._max_input_len = 0
        self._vocab_size = 0
        self._reqs: dict[str, _Req] = {}
        self._seq = 0
        self._rng = random.Random()
        self._started = self._closed = False
        self._failure: str | None = None
        self._stats_task: asyncio.Task | None = None
        self._stats_wakeup: asyncio.Event | None = None
        self._kv_known: asyncio.Event | None = None
        self._sample_applied: asyncio.Event | None = None   # set after each stats sample is applied
        self._sample: dict[str, Any] = {}     # the latest iteration stats
        self._sample_seq = -1                  # submissions up to this seq are reflected in _sample
        self._prompt_total = self._gen_total = self._cached_total = 0
        self._tokens_per_s = 0.0

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        self._api = _import_trtllm()
        self._stats_wakeup, self._kv_known, self._sample_applied = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.tokenizer, build, pretrained, manifest = await asyncio.to_thread(self._read_dirs)
        # Ids both the model embeds and the tokenizer decodes (an engine's vocab may be padded beyond it).
        self._vocab_size = min(self.tokenizer.vocab_size, int(pretrained.get("vocab_size") or self.tokenizer.vocab_size))
        self._llm = await asyncio.to_thread(self._load)      # slow: engine load, executor start
        self._gen_params = frozenset(inspect.signature(self._llm.generate_async).parameters)
        self._perf_metrics = "return_perf_metrics" in inspect.signature(self._api["SamplingParams"]).parameters
        if self._lora_paths and "lora_request" not in self._gen_params:
            raise EngineUnavailable("this TensorRT-LLM has no per-request LoRA (generate_async lacks lora_request)")
        for int_id, (name, path) in enumerate(sorted(self._lora_paths.items()), start=1):
            try:
                self._lora[name] = self._api["LoRARequest"](name, int_id, str(path))
            except ValueError as exc:
                raise EngineUnavailable(f"lora_adapters.{name}: {exc}") from exc
        plugins = build.get("plugin_config") or {}
        block_size = int(plugins.get("tokens_per_block") or 32)
        max_batch = min(self._max_batch_size or build["max_batch_size"], build["max_batch_size"])
        max_tokens = min(self._max_num_tokens or build.get("max_num_tokens") or 8192,
                         build.get("max_num_tokens") or 8192)
        self._max_input_len = int(build.get("max_input_len") or build["max_seq_len"])
        # Until the executor reports maxNumBlocks, assume only what is certainly there.
        kv_blocks = _blocks(self._kv_max_tokens, block_size) if self._kv_max_tokens else max_tokens // block_size
        self.info = EngineInfo(backend="trtllm",
                               model_name=self._model_name or (manifest.name if manifest else self.engine_dir.name),
                               version=self._version or (manifest.version if manifest else "unversioned"),
                               max_model_len=int(build["max_seq_len"]), block_size=block_size,
                               num_kv_blocks=kv_blocks, max_batch_size=max_batch, max_num_tokens=max_tokens,
                               prefix_caching=self._block_reuse)
        self._started = True
        self._stats_task = asyncio.get_running_loop().create_task(self._stats_loop(), name="trtllm-stats")

    def _read_dirs(self) -> tuple[HFTokenizer, dict, dict, Manifest | None]:
        import json
        manifest = self._check_artifact()      # first: never read files that fail their hashes
        try:
            config = json.loads((self.engine_dir / "config.json").read_text())
            build, pretrained = config["build_config"], config.get("pretrained_config") or {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EngineUnavailable(f"{self.engine_dir}: not a TensorRT-LLM engine directory ({exc})") from exc
        return HFTokenizer.from_dir(self.tokenizer_dir), build, pretrained, manifest

    def _check_artifact(self) -> Manifest | None:
        """With verify, the directory must be an artifact whose every file matches its manifest
        (ArtifactError names the file); hashing a multi-GB engine takes a while, hence off the loop."""
        if not self._verify:
            return read_manifest(self.engine_dir) if (self.engine_dir / MANIFEST_FILE).is_file() else None
        if not (self.engine_dir / MANIFEST_FILE).is_file():
            raise ArtifactError(f"{self.engine_dir}: no {MANIFEST_FILE}, so its files cannot be verified; publish it "
                                "with build_engines.py --target trtllm, or set verify = false to serve a bare "
                                "engine directory", MANIFEST_FILE)
        return verify_artifact(self.engine_dir)

    def _load(self) -> Any:
        api = self._api
        kv: dict[str, Any] = {"enable_block_reuse": self._block_reuse}
        if self._kv_fraction is not None:
            kv["free_gpu_memory_fraction"] = self._kv_fraction
        if self._kv_max_tokens is not None:
            kv["max_tokens"] = self._kv_max_tokens
        policy = getattr(api["CapacitySchedulerPolicy"], SCHEDULER_POLICIES[self._policy])
        kwargs: dict[str, Any] = dict(kv_cache_config=api["KvCacheConfig"](**kv),
                                      scheduler_config=api["SchedulerConfig"](capacity_scheduler_policy=policy),
                                      enable_chunked_prefill=self._chunked)
        if self._max_batch_size is not None:
            kwargs["max_batch_size"] = self._max_batch_size
        if self._max_num_tokens is not None:
            kwargs["max_num_tokens"] = self._max_num_tokens
        return api["LLM"](model=str(self.engine_dir), tokenizer=str(self.tokenizer_dir), **kwargs)

    async def warmup(self) -> None:
        """One short request from inside the loop (binds the API's queues to it) and the first KV stats."""
        if not self.healthy:
            raise EngineUnavailable("trtllm engine not started")
        prompt = tuple(self.tokenizer.encode("warmup")) or (0,)
        stream = self.submit(GenerationRequest(request_id=f"warmup-{id(self)}", prompt_token_ids=prompt,
                                               sampling=SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)))
        final = (await stream.collect())
        if final.finish_reason is FinishReason.ERROR:
            raise EngineUnavailable(f"trtllm warmup failed: {final.error}")
        try:
            await asyncio.wait_for(self._kv_known.wait(), WARMUP_STATS_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("no KV cache stats from TensorRT-LLM after warmup; capacity assumes %d blocks",
                        self.info.num_kv_blocks)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for request_id in list(self._reqs):
            self.abort(request_id)
        tasks = [r.task for r in self._reqs.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=ABORT_GRACE_S)
        for task in tasks + [self._stats_task]:
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in tasks + [self._stats_task] if t is not None), return_exceptions=True)
        if self._llm is not None:
            await asyncio.to_thread(self._llm.shutdown)

    @property
    def healthy(self) -> bool:
        return self._started and not self._closed and self._failure is None

    # -- requests ------------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestStream:
        if not self.healthy:
            raise EngineUnavailable(self._failure or "trtllm engine is not running")
        sp, info = request.sampling, self.info
        prompt_len = len(request.prompt_token_ids)
        if request.request_id in self._reqs:
            raise InvalidRequest(f"request id {request.request_id!r} is already in flight", "request_id")
        # Everything the executor would otherwise meet on the GPU: an out-of-vocabulary id there is an
        # illegal memory access that takes the whole executor down, not just this request.
        validate_request(request, vocab_size=self._vocab_size, max_model_len=info.max_model_len,
                         kv_capacity_tokens=info.num_kv_blocks * info.block_size if self._kv_known.is_set() else None)
        if prompt_len > self._max_input_len:
            raise InvalidRequest(f"the prompt has {prompt_len} tokens; this engine accepts at most "
                                 f"{self._max_input_len}", "prompt")
        blocks = _blocks(prompt_len + sp.max_tokens, info.block_size)
        lora = None
        if request.lora is not None:
            lora = self._lora.get(request.lora)
            if lora is None:
                raise InvalidRequest(f"unknown LoRA adapter {request.lora!r}", "model")
        kwargs: dict[str, Any] = {"sampling_params": self._sampling_params(sp), "streaming": True}
        if lora is not None:
            kwargs["lora_request"] = lora
        if "cache_salt" in self._gen_params:
            kwargs["cache_salt"] = request.tenant      # tenants never share prefix blocks
        try:
            output = self._llm.generate_async(list(request.prompt_token_ids), **kwargs)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"TensorRT-LLM rejected the request: {exc}",
                                 "max_tokens" if "max_tokens" in str(exc) or "max_seq_len" in str(exc) else None) from exc
        except RuntimeError as exc:          # "LLM is shutting down", CppExecutorError
            self._fail(f"TensorRT-LLM executor is down: {exc}")
            raise EngineUnavailable(self._failure) from exc
        self._seq += 1
        stream = RequestStream(request.request_id, on_cancel=self.abort)
        r = _Req(request, stream, blocks, self._seq,
                 IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids),
                 StopMatcher(sp.stop) if sp.stop else None)
        r.output = output
        self._reqs[r.id] = r
        self._prompt_total += prompt_len
        r.task = asyncio.get_running_loop().create_task(self._consume(r), name=f"trtllm-{r.id}")
        self._stats_wakeup.set()
        return stream

    def _sampling_params(self, sp: SamplingParams) -> Any:
        eos = self.tokenizer.eos_token_ids
        stop_ids = list(sp.stop_token_ids)
        if not sp.ignore_eos:
            stop_ids += [t for t in eos[1:] if t not in stop_ids]   # TRT has a single end_id
        kw: dict[str, Any] = dict(max_tokens=sp.max_tokens, ignore_eos=sp.ignore_eos, detokenize=False,
                                  stop_token_ids=stop_ids or None, include_stop_str_in_output=True)
        if eos:
            kw["end_id"] = eos[0]
        if self._perf_metrics:
            kw["return_perf_metrics"] = True   # the executor's own prefill timing, for Server-Timing
        if sp.greedy:
            kw["top_k"] = 1                   # the LLM API's greedy: top_k 1, top_p unset
        else:
            # The executor's seed is a C++ uint64; a value outside it would fail the request at enqueue.
            seed = seed64(sp.seed) if sp.seed is not None else self._rng.getrandbits(63)
            kw.update(temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, seed=seed)
        return self._api["SamplingParams"](**kw)

    def abort(self, request_id: str) -> None:
        r = self._reqs.get(request_id)
        if r is None or r.aborting or r.ended:
            return
        # The stream ends when the executor confirms ('cancelled'): its blocks are free by then.
        self._cancel_in_executor(r)

    def _cancel_in_executor(self, r: _Req) -> None:
        """Ask the executor to drop the request. Its 'cancelled' reply is not guaranteed (API contract):
        if none comes within ABORT_GRACE_S the request is given up on, so nothing waits forever."""
        r.aborting = True
        self._abort_output(r)
        r.overdue = asyncio.get_running_loop().call_later(ABORT_GRACE_S, self._abort_overdue, r)

    def _abort_output(self, r: _Req) -> None:
        if r.output is not None and not r.output.finished:
            try:
                r.output.abort()
            except Exception as exc:   # executor gone; the request ends anyway
                log.warning("abort of %s failed: %s", r.id, exc)

    def _abort_overdue(self, r: _Req) -> None:
        if not r.released:
            log.warning("request %s: no 'cancelled' from TensorRT-LLM %.0fs after abort", r.id, ABORT_GRACE_S)
            if r.task is not None:
                r.task.cancel()

    async def _consume(self, r: _Req) -> None:
        try:
            async for out in r.output:
                self._on_step(r, out)
                if r.released:
                    return
            self._finish(r, FinishReason.ERROR, error="TensorRT-LLM ended the request without a result")
        except asyncio.CancelledError:
            self._abort_output(r)
            self._finish(r, FinishReason.ABORT)
            raise
        except self._api["RequestError"] as exc:
            self._finish(r, FinishReason.ERROR, error=f"TensorRT-LLM failed this request: {exc}")
        except Exception as exc:   # the executor died (worker gone, CppExecutorError): nothing will finish
            self._fail(f"TensorRT-LLM executor failed: {exc!r}")

    def _on_step(self, r: _Req, out: Any) -> None:
        if r.ended:          # stopped by a stop string: only the executor's final reply is still awaited
            if out.finished:
                self._release(r)
            return
        c = out.outputs[0]
        ids = c.token_ids
        new = list(ids[r.sent:]) if len(ids) > r.sent else []
        r.sent = max(r.sent, len(ids))
        r.cached = getattr(out, "cached_tokens", 0) or 0
        if new and r.first_token is None:
            r.first_token = time.monotonic()
        final = out.finished
        text = ""
        if r.stopped:
            new = []
        elif new:
            # A matched stop token id ends the output without text (as EOS does).
            textual = new[:-1] if final and c.finish_reason == "stop" and isinstance(c.stop_reason, int) else new
            text = r.detok.push(textual)
        if final and not r.stopped:
            text += r.detok.flush()
        if r.matcher is not None and not r.stopped:
            text, r.stopped = r.matcher.push(text)
            if r.stopped and not final:
                # The client gets its final delta now, not after TensorRT-LLM's 'cancelled' (which may
                # never come); the request stays counted in capacity until the executor lets it go.
                r.emitted += len(new)
                self._end_stream(r, FinishReason.STOP, new, text)
                self._cancel_in_executor(r)
                return
            if final and not r.stopped:
                text += r.matcher.flush()
        r.emitted += len(new)
        if not final:
            if new or text:
                r.stream.push(Delta(token_ids=new, text=text))
            return
        reason = FinishReason.STOP if r.stopped else _FINISH.get(c.finish_reason, FinishReason.ABORT)
        if r.aborting and not r.stopped:
            reason = FinishReason.ABORT
        self._finish(r, reason, new, text)

    def _finish(self, r: _Req, reason: FinishReason, token_ids: list[int] | None = None, text: str = "",
                error: str | None = None) -> None:
        self._end_stream(r, reason, token_ids, text, error)
        self._release(r)

    def _release(self, r: _Req) -> None:
        if r.released:
            return
        r.released = True
        self._reqs.pop(r.id, None)
        if r.overdue is not None:
            r.overdue.cancel()

    def _end_stream(self, r: _Req, reason: FinishReason, token_ids: list[int] | None = None, text: str = "",
                    error: str | None = None) -> None:
        if r.ended:
            return
        r.ended = True
        cached = min(r.cached, max(r.prompt_len - 1, 0))
        self._gen_total += r.emitted
        self._cached_total += cached
        now = time.monotonic()
        first = r.first_token if r.first_token is not None else now
        r.stream.push(Delta(token_ids=token_ids or [], text=text, finish_reason=reason, error=error,
                            usage=Usage(prompt_tokens=r.prompt_len, completion_tokens=r.emitted, cached_tokens=cached),
                            timing=EngineTiming(submitted=r.submitted, first_scheduled=_scheduled_at(r, first),
                                                first_token=first, finished=now)))

    def _fail(self, message: str) -> None:
        """The executor is gone: report unhealthy and end every stream now instead of letting it hang."""
        if self._failure is None:
            self._failure = message
            log.error("%s", message)
        for r in list(self._reqs.values()):
            self._finish(r, FinishReason.ERROR, error="the TensorRT-LLM engine failed")
            if r.task is not None and r.task is not asyncio.current_task():
                r.task.cancel()

    # -- capacity and stats ----------------------------------------------------------------------------------
    async def _stats_loop(self) -> None:
        """Drain the executor's iteration stats. The stream ends after STATS_TIMEOUT_S idle and only
        restarts once a request is submitted, so wait for one before iterating again."""
        while True:
            await self._stats_wakeup.wait()
            self._stats_wakeup.clear()
            try:
                async for item in self._llm.get_stats_async(timeout=STATS_TIMEOUT_S):
                    self._on_stats(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # stats are advisory; requests report real failures
                log.warning("TensorRT-LLM stats stream failed: %r", exc)
                if not self.healthy:
                    return

    def _on_stats(self, item: dict) -> None:
        kv = item.get("kvCacheStats") or {}
        self._sample = item
        self._sample_seq = self._seq
        latency_ms = item.get("iterLatencyMS")
        latency = (latency_ms or 0.0) / 1000.0
        observer = self.step_observer
        if observer is not None and latency_ms is not None:
            try:
                observer(latency)
            except Exception:  # metrics must never take the engine down
                log.exception("step_observer failed")
        ifb = item.get("inflightBatchingStats") or {}
        tokens = (ifb.get("numCtxTokens") or 0) + (ifb.get("numGenRequests") or 0)
        if latency > 0:
            self._tokens_per_s = 0.9 * self._tokens_per_s + 0.1 * (tokens / latency)
        max_blocks, block_size = kv.get("maxNumBlocks"), kv.get("tokensPerBlock")
        if max_blocks and not self._kv_known.is_set():
            changes: dict[str, Any] = {"num_kv_blocks": int(max_blocks)}
            if block_size:
                changes["block_size"] = int(block_size)
            self.info = msgspec.structs.replace(self.info, **changes)
            self._kv_known.set()
        self._sample_applied.set()

    def capacity(self) -> Capacity:
        info, reqs = self.info, self._reqs
        free = info.num_kv_blocks - sum(r.blocks for r in reqs.values())
        kv = self._sample.get("kvCacheStats") or {}
        sampled_free = kv.get("freeNumBlocks")
        if reqs and sampled_free is not None:
            # The executor's own count, less what admission submitted since that sample was taken.
            since = sum(r.blocks for r in reqs.values() if r.seq > self._sample_seq)
            free = min(free, sampled_free - since)
        free = max(0, free)
        # The executor does not report per-request prefill progress: a request whose first token has
        # not arrived counts its whole prompt as pending (an over-estimate, never an under-report).
        waiting = pending = 0
        for r in reqs.values():
            if r.first_token is None:
                waiting += 1
                pending += r.prompt_len
        return Capacity(free_kv_blocks=free, free_kv_tokens=free * info.block_size, waiting=waiting,
                        free_slots=max(0, info.max_batch_size - len(reqs)), block_size=info.block_size,
                        pending_prefill_tokens=pending)

    def stats(self) -> EngineStats:
        kv = self._sample.get("kvCacheStats") or {}
        waiting = sum(1 for r in self._reqs.values() if r.first_token is None)
        return EngineStats(
            running=len(self._reqs) - waiting, waiting=waiting, kv_blocks_total=self.info.num_kv_blocks,
            kv_blocks_used=int(kv.get("usedNumBlocks") or 0) if self._reqs else 0,
            prefix_cache_hit_rate=self._cached_total / self._prompt_total if self._prompt_total else 0.0,
            step_latency_s=(self._sample.get("iterLatencyMS") or 0.0) / 1000.0,
            steps_total=int(self._sample.get("iter") or 0), prompt_tokens_total=self._prompt_total,
            generation_tokens_total=self._gen_total, prefix_cache_hit_tokens_total=self._cached_total,
            tokens_per_s=self._tokens_per_s)

"""The TensorRT-LLM backend: a TensorRT engine directory served through the LLM API (1.2.x).

Written against docs/trtllm-api.md and tested with tests/trtllm_double; see docs/gpu.md for
what has (not) run on a GPU. The rules that shape this module, all from the API contract:

- `tensorrt_llm._tensorrt_engine.LLM` (the TensorRT-engine backend), built off the loop in start().
- `generate_async` is called on the event-loop thread (its result queues bind to the running loop),
  with token ids, keyword arguments only, and always `max_tokens` (its default is 32).
- Each request's RequestOutput becomes its delta stream in inferd.engine.trtllm.stream (our own
  detokenizing and stop strings; cancels whose 'cancelled' reply may never come).
- Capacity and stats (reservations mirroring GUARANTEED_NO_EVICT, the executor's iteration stats) are
  kept in inferd.engine.trtllm.stats.
- LoRA adapters (an AdapterHost): each configured adapter is checked and given its LoRARequest at start
  and by load_adapter; TensorRT-LLM reads its weights on the first request carrying it. What "load" and
  "unload" can mean over this API is in inferd.engine.trtllm.loras.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import random
from pathlib import Path
from typing import Any

from inferd.artifacts import (
    MANIFEST_FILE,
    ArtifactError,
    Manifest,
    read_manifest,
    template_tool_call_format,
    verify_artifact,
)
from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats, EngineUnavailable, InvalidRequest, blocks_for
from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import HFTokenizer, IncrementalDetokenizer, StopMatcher
from inferd.engine.validation import seed64, validate_request
from inferd.engine.adapters import AdapterError, AdapterInfo, UnknownAdapter, unknown_adapter_request
from inferd.engine.grammar import Grammars
from inferd.engine.trtllm.guided import check_compiled, guided_decoding_params
from inferd.engine.trtllm.loras import TrtllmLoras
from inferd.engine.trtllm.sampling import penalty_kwargs, refuse_unsupported
from inferd.engine.trtllm.stats import RequestLedger
from inferd.engine.trtllm.stream import ABORT_GRACE_S, TrackedRequest
from inferd.types import FinishReason, GenerationRequest, SamplingParams

log = logging.getLogger("inferd.engine.trtllm")

INSTALL_HINT = ("TensorRT-LLM is not installed. On a GPU node (Linux x86_64/aarch64, Python 3.10 or 3.12, "
                "CUDA 13 driver): pip install 'inferd[trtllm]' --extra-index-url https://pypi.nvidia.com "
                "(see docs/gpu.md)")
SCHEDULER_POLICIES = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}
STATS_TIMEOUT_S = 2.0        # get_stats_async ends after this long without an iteration
WARMUP_STATS_TIMEOUT_S = 5.0


class TrtllmNotInstalled(EngineUnavailable):
    """`tensorrt_llm` cannot be imported here."""


def _import_trtllm() -> dict[str, Any]:
    try:
        from tensorrt_llm._tensorrt_engine import LLM
        from tensorrt_llm.llmapi import (
            CapacitySchedulerPolicy,
            KvCacheConfig,
            LoRARequest,
            RequestError,
            SchedulerConfig,
        )
        from tensorrt_llm.llmapi import SamplingParams as TrtSamplingParams
        from tensorrt_llm.sampling_params import GuidedDecodingParams
    except ImportError as exc:
        raise TrtllmNotInstalled(f"{INSTALL_HINT} [import failed: {exc}]") from exc
    return dict(LLM=LLM, CapacitySchedulerPolicy=CapacitySchedulerPolicy, KvCacheConfig=KvCacheConfig,
                GuidedDecodingParams=GuidedDecodingParams,
                LoRARequest=LoRARequest, RequestError=RequestError, SamplingParams=TrtSamplingParams,
                SchedulerConfig=SchedulerConfig)


class TrtllmEngine(Engine):
    """`step_observer` (base.Engine; the daemon sets it) gets each executor iteration's wall time in
    seconds (`iterLatencyMS` of its stats sample), once per sample, on the event-loop thread."""

    def __init__(self, engine_dir: Path, *, tokenizer_dir: Path | None = None, max_batch_size: int | None = None,
                 max_num_tokens: int | None = None, kv_cache_free_gpu_memory_fraction: float | None = None,
                 kv_cache_max_tokens: int | None = None, enable_block_reuse: bool = True,
                 scheduler_policy: str = "guaranteed_no_evict", enable_chunked_prefill: bool = True,
                 lora_adapters: dict[str, str] | None = None, model_name: str | None = None,
                 version: str | None = None, verify: bool = True,
                 adapter_trusted_keys: dict[str, str] | None = None, gather_generation_logits: bool = False,
                 eagle: tuple[str, int] | None = None) -> None:
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
        # Adapters are hashed against their manifests at every load whatever `verify` says: the daemon
        # passes verify=False once it has checked the engine artifact itself, which covers no adapter.
        self._loras = TrtllmLoras(lora_adapters or {}, trusted=adapter_trusted_keys, verify=True)
        self._model_name, self._version = model_name, version
        self._verify = verify
        # TensorRT-LLM's logprobs need the engine to gather generation logits for every request (a cost all
        # pay, so off unless asked): without it a logprobs request is a 400 naming `logprobs`.
        self._gather_logits = gather_generation_logits
        # EAGLE speculative decoding (the EAGLE head's directory, drafts per step): passed to the LLM API as
        # its speculative_config, as the engine was built with it (inferd.artifacts.build.trtllm_options)
        self._eagle = eagle
        self.info = EngineInfo(backend="trtllm", model_name=model_name or self.engine_dir.name,
                               version=version or "unknown", max_model_len=0, block_size=0, num_kv_blocks=0,
                               max_batch_size=0, max_num_tokens=0, hardware="gpu")
        self.tokenizer: HFTokenizer | None = None
        self._api: dict[str, Any] = {}
        self._llm: Any = None
        self._gen_params: frozenset[str] = frozenset()
        self._perf_metrics = False     # SamplingParams.return_perf_metrics exists (per-request timing)
        self._max_input_len = 0
        self._vocab_size = 0
        self._embedding_vocab = 0      # the engine's vocabulary, padding included (embedding_bias's size)
        self._ledger = RequestLedger(speculating=eagle is not None)
        self._reqs = self._ledger.requests     # request id -> TrackedRequest, until the executor lets go
        self._rng = random.Random()
        self._started = self._closed = False
        self._failure: str | None = None
        self._stats_task: asyncio.Task | None = None
        self._stats_wakeup: asyncio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        self._api = _import_trtllm()
        self._stats_wakeup = asyncio.Event()
        self.tokenizer, build, pretrained, manifest = await asyncio.to_thread(self._read_dirs)
        # Ids both the model embeds and the tokenizer decodes (an engine's vocab may be padded beyond it).
        self._embedding_vocab = int(pretrained.get("vocab_size") or self.tokenizer.vocab_size)
        self._vocab_size = min(self.tokenizer.vocab_size, self._embedding_vocab)
        # Our own xgrammar over the same tokenizer: the API compiles with it (its 400s are every backend's);
        # TensorRT-LLM compiles again in its executor and masks there (trtllm.guided).
        self.grammars = Grammars.for_hf(self.tokenizer, self._embedding_vocab)
        self._llm = await asyncio.to_thread(self._load)      # slow: engine load, executor start
        self._gen_params = frozenset(inspect.signature(self._llm.generate_async).parameters)
        self._perf_metrics = "return_perf_metrics" in inspect.signature(self._api["SamplingParams"]).parameters
        if self._loras.names() and "lora_request" not in self._gen_params:
            raise EngineUnavailable("this TensorRT-LLM has no per-request LoRA (generate_async lacks lora_request)")
        for name in self._loras.names():        # an adapter that fails is refused alone; the base serves
            try:
                await self._load_adapter(name)
            except AdapterError as exc:
                log.error("LoRA adapter %r refused at start: %s", name, exc)
        plugins = build.get("plugin_config") or {}
        block_size = int(plugins.get("tokens_per_block") or 32)
        max_batch = min(self._max_batch_size or build["max_batch_size"], build["max_batch_size"])
        max_tokens = min(self._max_num_tokens or build.get("max_num_tokens") or 8192,
                         build.get("max_num_tokens") or 8192)
        self._max_input_len = int(build.get("max_input_len") or build["max_seq_len"])
        # Until the executor reports maxNumBlocks, assume only what is certainly there.
        kv_blocks = blocks_for(self._kv_max_tokens, block_size) if self._kv_max_tokens else max_tokens // block_size
        self.info = EngineInfo(backend="trtllm",
                               model_name=self._model_name or (manifest.name if manifest else self.engine_dir.name),
                               version=self._version or (manifest.version if manifest else "unversioned"),
                               max_model_len=int(build["max_seq_len"]), block_size=block_size,
                               num_kv_blocks=kv_blocks, max_batch_size=max_batch, max_num_tokens=max_tokens,
                               prefix_caching=self._block_reuse, hardware="gpu",
                               tool_call_format=(manifest.tool_call_format if manifest else None)
                               or template_tool_call_format(self.tokenizer.chat_template) or "hermes",
                               precision=str((manifest.build.get("precision") if manifest else None)
                                             or pretrained.get("dtype") or ""))
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
                                      enable_chunked_prefill=self._chunked,
                                      guided_decoding_backend="xgrammar")    # structured output (trtllm.guided)
        if self._max_batch_size is not None:
            kwargs["max_batch_size"] = self._max_batch_size
        if self._max_num_tokens is not None:
            kwargs["max_num_tokens"] = self._max_num_tokens
        if self._gather_logits:
            kwargs["gather_generation_logits"] = True
        if self._eagle is not None:
            from inferd.artifacts.build import eagle_config

            kwargs["speculative_config"] = eagle_config(*self._eagle)
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
            await asyncio.wait_for(self._ledger.kv_known.wait(), WARMUP_STATS_TIMEOUT_S)
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
        pending = [t for t in tasks + [self._stats_task] if t is not None and not t.done()]
        for task in pending:
            task.cancel()
        # A cancel can be swallowed (asyncio.wait_for in 3.10/3.11 returns a result that raced it), so the
        # stats loop also checks _closed when woken, and close() never waits on a task without a bound.
        self._stats_wakeup.set()
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=STATS_TIMEOUT_S + 1.0)
            if stuck:
                log.warning("TensorRT-LLM engine closed with %d task(s) still running", len(stuck))
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
                         kv_capacity_tokens=info.num_kv_blocks * info.block_size if self._ledger.kv_known.is_set() else None)
        refuse_unsupported(sp)
        if sp.guided is not None:
            check_compiled(self.grammars, sp.guided)
        if prompt_len > self._max_input_len:
            raise InvalidRequest(f"the prompt has {prompt_len} tokens; this engine accepts at most "
                                 f"{self._max_input_len}", "prompt")
        self._check_logprobs(sp)
        blocks = blocks_for(prompt_len + sp.max_tokens, info.block_size)
        lora = None
        if request.lora is not None:
            if request.lora not in self._loras:
                raise unknown_adapter_request(request.lora, self._loras.names())
            lora = self._loras.request_for(request.lora)
            if lora is None:
                raise InvalidRequest(self._loras.not_loaded_reason(request.lora), "model")
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
        stream = RequestStream(request.request_id, on_cancel=self.abort)
        r = TrackedRequest(request, stream, output, self._ledger, blocks,
                           IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids),
                           StopMatcher(sp.stop) if sp.stop else None)
        self._ledger.admit(r)
        r.task = asyncio.get_running_loop().create_task(r.consume(self._api["RequestError"], self._fail),
                                                        name=f"trtllm-{r.id}")
        self._stats_wakeup.set()
        return stream

    def _check_logprobs(self, sp: SamplingParams) -> None:
        """What TensorRT-LLM cannot answer is a 400 naming the parameter (docs/trtllm-api.md, logprobs)."""
        if sp.prompt_logprobs is not None:
            # tensorrt_llm/executor/result.py compute_logprobs: prompt logprobs are each position's top-k only,
            # never the prompt token's own value, which echo's token_logprobs must carry.
            raise InvalidRequest("echo with logprobs is not available on the TensorRT-LLM backend: its prompt "
                                 "logprobs do not include each prompt token's own log-probability", "echo")
        if sp.logprobs is not None and not self._gather_logits:
            raise InvalidRequest("logprobs is not available on this TensorRT-LLM engine: it runs without "
                                 "gather_generation_logits", "logprobs")

    def _sampling_params(self, sp: SamplingParams) -> Any:
        eos = self.tokenizer.eos_token_ids
        stop_ids = list(sp.stop_token_ids)
        ignore_eos = sp.ignore_eos and sp.guided is None     # a grammar ends on the end token (trtllm.guided)
        if not ignore_eos:
            stop_ids += [t for t in eos[1:] if t not in stop_ids]   # TRT has a single end_id
        kw: dict[str, Any] = dict(max_tokens=sp.max_tokens, ignore_eos=ignore_eos, detokenize=False,
                                  stop_token_ids=stop_ids or None, include_stop_str_in_output=True)
        if sp.guided is not None:
            kw["guided_decoding"] = guided_decoding_params(sp.guided, self._api["GuidedDecodingParams"])
        if eos:
            kw["end_id"] = eos[0]
        if sp.logprobs is not None:
            kw["logprobs"] = max(1, sp.logprobs)     # 0 returns none (compute_logprobs: `if k_logprobs`)
        if self._perf_metrics:
            kw["return_perf_metrics"] = True   # the executor's own prefill timing, for Server-Timing
        if sp.greedy:
            kw["top_k"] = 1                   # the LLM API's greedy: top_k 1, top_p unset
        else:
            # The executor's seed is a C++ uint64; a value outside it would fail the request at enqueue.
            seed = seed64(sp.seed) if sp.seed is not None else self._rng.getrandbits(63)
            kw.update(temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, seed=seed)
        kw.update(penalty_kwargs(sp, self._embedding_vocab))
        return self._api["SamplingParams"](**kw)

    def abort(self, request_id: str) -> None:
        r = self._reqs.get(request_id)
        if r is None or r.aborting or r.ended:
            return
        # The stream ends when the executor confirms ('cancelled'): its blocks are free by then.
        r.cancel_in_executor()

    def _fail(self, message: str) -> None:
        """The executor is gone: report unhealthy and end every stream now instead of letting it hang."""
        if self._failure is None:
            self._failure = message
            log.error("%s", message)
        for r in list(self._reqs.values()):
            r.finish(FinishReason.ERROR, error="the TensorRT-LLM engine failed")
            if r.task is not None and r.task is not asyncio.current_task():
                r.task.cancel()

    # -- LoRA adapters: AdapterHost -------------------------------------------------------------------------
    def adapters(self) -> list[AdapterInfo]:
        """Every configured adapter, by name; `loaded`: requests naming it are sent to TensorRT-LLM."""
        return self._loras.infos()

    def adapter(self, name: str) -> AdapterInfo | None:
        try:
            return self._loras.info(name)
        except UnknownAdapter:
            return None

    async def load_adapter(self, name: str) -> AdapterInfo:
        """Check the adapter's directory again (off the loop) and send requests naming it from now on, under a
        fresh adapter id (so changed files are read anew). Raises UnknownAdapter, AdapterLoadError
        (AdapterSignatureError), EngineUnavailable (not started). The weights load on its first request."""
        self._loras.source(name)
        if not self.healthy:
            raise EngineUnavailable(self._failure or "trtllm engine is not running")
        await self._load_adapter(name)
        return self._loras.info(name)

    async def unload_adapter(self, name: str) -> bool:
        """Refuse new requests naming the adapter until it is loaded again; False when it was not loaded.
        Requests already running keep it; TensorRT-LLM's cache keeps its weights until its LRU evicts them."""
        return self._loras.unload(name)

    async def _load_adapter(self, name: str) -> None:
        try:
            checked = await asyncio.to_thread(self._loras.check, name)
            self._loras.register(name, checked, self._api["LoRARequest"])
        except AdapterError as exc:
            self._loras.refuse(name, str(exc))
            raise

    # -- capacity and stats ----------------------------------------------------------------------------------
    async def _stats_loop(self) -> None:
        """Drain the executor's iteration stats. The stream ends after STATS_TIMEOUT_S idle and only
        restarts once a request is submitted, so wait for one before iterating again."""
        while not self._closed:
            await self._stats_wakeup.wait()
            self._stats_wakeup.clear()
            if self._closed:
                return
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
        self.info = self._ledger.apply_sample(item, self.info, self.step_observer)

    def capacity(self) -> Capacity:
        return self._ledger.capacity(self.info)

    def stats(self) -> EngineStats:
        return self._ledger.stats(self.info)

"""Mirrors tensorrt_llm/llmapi/llm.py: BaseLLM, _TrtLLM (TensorRT engines), _TorchLLM, RequestOutput."""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Union

from .._double.controls import controls
from .._double.executor import FakeExecutor, FakeModel, _Fatal
from .._double.guided import GuidedDecoder
from ..executor.result import GenerationResult, IterationResult
from ..executor.utils import RequestError
from ..sampling_params import SamplingParams
from .llm_args import BuildConfig, KvCacheConfig, SchedulerConfig, validate_trt_llm_args
from .quant_spec import quantize_on_build, validate_quant_and_speculation
from .tokenizer import load_tokenizer

logger = logging.getLogger("tensorrt_llm")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "generation_config.json", "chat_template.jinja")


@dataclass
class _GenerationRequest:
    id: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    streaming: bool
    lora_request: Any
    cache_salt: Optional[str]


class RequestOutput(GenerationResult):
    """The output of a request, mutated in place by every streamed step."""

    def __init__(self, request, executor, handler, tokenizer, prompt: Optional[str]) -> None:
        super().__init__(request, executor, handler, tokenizer)
        self.prompt = prompt

    def _handle_response(self, response) -> None:
        if isinstance(response, _Fatal):
            self._background_error_handler()()
            return
        super()._handle_response(response)


def _is_engine_dir(path: Path) -> bool:
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return "build_config" in json.loads(config.read_text())
    except ValueError:
        return False


class BaseLLM:
    def __init__(self, model: Union[str, Path], tokenizer: Optional[Union[str, Path]] = None,
                 tokenizer_mode: str = "auto", skip_tokenizer_init: bool = False, trust_remote_code: bool = False,
                 tensor_parallel_size: int = 1, dtype: str = "auto", revision: Optional[str] = None,
                 tokenizer_revision: Optional[str] = None, **kwargs: Any) -> None:
        controls.calls.append(("LLM", dict(model=model, tokenizer=tokenizer, **kwargs)))
        self._executor: Optional[FakeExecutor] = None
        validate_trt_llm_args(kwargs)
        validate_quant_and_speculation(kwargs)
        self.args = dict(kwargs, tensor_parallel_size=tensor_parallel_size, dtype=dtype)
        model = Path(model)
        if not model.exists():
            raise ValueError(f"model {model} does not exist (no network here: hub names cannot be resolved)")
        self._workspace = tempfile.TemporaryDirectory(prefix="trtllm-double-")
        self._engine_dir: Optional[Path] = None
        if _is_engine_dir(model):
            if kwargs.get("build_config") is not None:
                logger.warning("build_config is ignored for an engine directory")
            self._engine_dir = model
        else:
            try:
                self._engine_dir = self._build(model, kwargs.get("build_config") or BuildConfig(), dtype)
            except Exception:
                self._workspace.cleanup()          # a failed build leaves no workspace behind
                raise
        self.tokenizer = None if skip_tokenizer_init else load_tokenizer(tokenizer or self._engine_dir)
        self._load(kwargs)
        self._stats_lock = threading.Lock()

    # -- building (a fake "engine": config.json + rank0.engine) ----------------------------------
    def _build(self, hf_dir: Path, build_config: BuildConfig, dtype: str) -> Path:
        hf_config_file = hf_dir / "config.json"
        if not hf_config_file.is_file():
            raise ValueError(f"{hf_dir} is neither a Hugging Face model nor a TensorRT-LLM engine directory")
        hf = json.loads(hf_config_file.read_text())
        quantize_on_build(hf_dir, hf, self.args)
        out = Path(self._workspace.name) / "engine"
        out.mkdir()
        max_seq_len = build_config.max_seq_len or hf.get("max_position_embeddings", 2048)
        config = {
            "version": "1.2.1",
            "pretrained_config": {"architecture": (hf.get("architectures") or ["LlamaForCausalLM"])[0],
                                  "dtype": dtype if dtype != "auto" else hf.get("torch_dtype", "float16"),
                                  "vocab_size": hf.get("vocab_size"),
                                  "quantization": self._quantization(),
                                  "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}},
            "build_config": {"max_input_len": min(build_config.max_input_len, max_seq_len),
                             "max_seq_len": max_seq_len, "max_batch_size": build_config.max_batch_size,
                             "max_beam_width": build_config.max_beam_width,
                             "max_num_tokens": build_config.max_num_tokens,
                             # llm_args.py validate_speculative_config: an Eagle config sets both at build
                             **self._speculative_build(),
                             "plugin_config": {"tokens_per_block": 32, "use_paged_context_fmha": True,
                                               "lora_plugin": "auto" if self.args.get("enable_lora") else None}},
        }
        (out / "config.json").write_text(json.dumps(config, indent=2))
        (out / "rank0.engine").write_bytes(b"double-engine:" + json.dumps(config, sort_keys=True).encode())
        for name in _TOKENIZER_FILES:
            if (hf_dir / name).is_file():
                shutil.copy2(hf_dir / name, out / name)
        return out

    def _speculative_build(self) -> dict:
        spec = self.args.get("speculative_config")
        if spec is None:
            return {"speculative_decoding_mode": None, "max_draft_len": 0}
        return {"speculative_decoding_mode": spec.decoding_type.upper(), "max_draft_len": spec.max_draft_len}

    def _quantization(self) -> dict:
        """What a real build writes to pretrained_config.quantization (quant_algo, kv_cache_quant_algo)."""
        q = self.args.get("quant_config")
        if q is None:
            return {"quant_algo": None, "kv_cache_quant_algo": None}
        return {"quant_algo": q.quant_algo.value if q.quant_algo else None,
                "kv_cache_quant_algo": q.kv_cache_quant_algo.value if q.kv_cache_quant_algo else None}

    def _load(self, kwargs: dict) -> None:
        engine_config = json.loads((self._engine_dir / "config.json").read_text())
        if not (self._engine_dir / "rank0.engine").is_file():
            raise FileNotFoundError(f"{self._engine_dir / 'rank0.engine'} not found")
        build = engine_config["build_config"]
        plugins = build.get("plugin_config", {})
        self.build_config = build

        def runtime_cap(name: str, default):
            value = kwargs.get(name) if kwargs.get(name) is not None else default
            if value is not None and value > build[name]:
                logger.warning("%s %s exceeds the engine's %s; clipped", name, value, build[name])
                value = build[name]
            return value or build[name]

        kv: KvCacheConfig = kwargs.get("kv_cache_config") or KvCacheConfig()
        sched: SchedulerConfig = kwargs.get("scheduler_config") or SchedulerConfig()
        tpb = int(plugins.get("tokens_per_block", 32))
        limits = []
        if kv.max_tokens is not None:
            limits.append(-(-kv.max_tokens // tpb))
        if kv.free_gpu_memory_fraction is not None:
            limits.append(int(kv.free_gpu_memory_fraction * controls.fake_gpu_kv_tokens) // tpb)
        self.scheduler_config = sched
        if self.tokenizer is None:
            candidates = list(range(3, 259))
        else:
            candidates = self.tokenizer.ordinary_token_ids()
        vocab_size = (engine_config.get("pretrained_config") or {}).get("vocab_size") or (
            self.tokenizer.vocab_size if self.tokenizer is not None else 259)
        backend = kwargs.get("guided_decoding_backend")
        if backend is not None and backend != "xgrammar":      # llm.py _build_model (TensorRT backend)
            raise ValueError(f"Unrecognized guided decoding backend {backend}")
        guided = GuidedDecoder(self.tokenizer, vocab_size) if backend == "xgrammar" else None
        self._executor = FakeExecutor(
            model=FakeModel(candidates), guided=guided, vocab_size=vocab_size,
            max_batch_size=runtime_cap("max_batch_size", None),
            max_num_tokens=runtime_cap("max_num_tokens", 8192), max_seq_len=build["max_seq_len"],
            max_input_len=build["max_input_len"], num_blocks=min(limits), tokens_per_block=tpb,
            enable_block_reuse=kv.enable_block_reuse, enable_chunked_context=bool(kwargs.get("enable_chunked_prefill")),
            lora_enabled=plugins.get("lora_plugin") not in (None, "disable"), error_handler_owner=self)

    # -- public API ----------------------------------------------------------------------------------
    @property
    def workspace(self) -> Path:
        return Path(self._workspace.name)

    @property
    def llm_id(self) -> str:
        return f"double-{id(self)}"

    def generate(self, inputs, sampling_params: Optional[SamplingParams] = None, use_tqdm: bool = True,
                 lora_request=None, **kwargs):
        unbatched = not isinstance(inputs, list) or (inputs and isinstance(inputs[0], int))
        batch = [inputs] if unbatched else inputs
        futures = [self.generate_async(p, sampling_params=sampling_params, lora_request=lora_request)
                   for p in batch]
        for f in futures:
            f.result()
        return futures[0] if unbatched else futures

    def generate_async(self, inputs, *, sampling_params: Optional[SamplingParams] = None,
                       lora_request=None, prompt_adapter_request=None, streaming: bool = False,
                       kv_cache_retention_config=None, disaggregated_params=None, _postproc_params=None,
                       scheduling_params=None, cache_salt: Optional[str] = None) -> RequestOutput:
        controls.calls.append(("generate_async", dict(sampling_params=sampling_params, streaming=streaming,
                                                      lora_request=lora_request, cache_salt=cache_salt)))
        if self._executor is None or self._executor.is_shutdown():
            raise RuntimeError("LLM is shutting down")
        prompt = None
        if isinstance(inputs, str):
            prompt, ids = inputs, self.tokenizer.encode(inputs)
        elif isinstance(inputs, list) and all(isinstance(t, int) for t in inputs):
            ids = list(inputs)
        elif isinstance(inputs, dict) and "prompt_token_ids" in inputs:
            ids = list(inputs["prompt_token_ids"])
        elif isinstance(inputs, dict) and "prompt" in inputs:
            prompt, ids = inputs["prompt"], self.tokenizer.encode(inputs["prompt"])
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        sp = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"The sampling_params must be type SamplingParams or None, but got {type(sp)}")
        if sp.end_id is None:
            if self.tokenizer is None:
                raise ValueError("tokenizer is required to reset end_id if it is None, or you can explicitly "
                                 "specify the end_id for sampling_params")
            sp._setup(self.tokenizer)
        elif sp.stop is not None:
            sp._setup(self.tokenizer)
        if sp.logprobs and not self.args.get("gather_generation_logits"):
            # _check_arguments on the TensorRT backend (docs/trtllm-api.md): logprobs need generation logits
            raise ValueError("`gather_generation_logits` must be True when `logprobs` is set")
        if sp.prompt_logprobs:
            raise ValueError("`prompt_logprobs` requires an engine built with `gather_context_logits`")
        max_seq_len = self.build_config["max_seq_len"]
        if not self.args.get("enable_chunked_prefill") and len(ids) + sp.max_tokens > max_seq_len:
            raise ValueError(f"The sum of prompt length ({len(ids)}), query length (0) and max_tokens "
                             f"({sp.max_tokens}) should not exceed max_seq_len ({max_seq_len})")
        if sp.n > self._executor.max_batch_size:
            raise ValueError(f"n ({sp.n}) should not exceed max_batch_size ({self._executor.max_batch_size})")
        request = _GenerationRequest(self._executor.new_request_id(), ids, sp, streaming, lora_request, cache_salt)
        result = RequestOutput(request, self._executor, self._handle_background_error, self.tokenizer, prompt)
        with self._stats_lock:
            if self._executor.iteration_result is None:
                self._executor.iteration_result = IterationResult()
            else:
                self._executor.iteration_result.mark_undone()
        self._executor.submit(request, result)
        return result

    def _handle_background_error(self, error: Optional[Union[Exception, str]] = None) -> None:
        if isinstance(error, str):
            raise RequestError(error)
        if isinstance(error, Exception):
            raise error
        q = self._executor.error_queue
        if not q.empty():
            exc = q.get()
            self._executor.shutdown()
            raise exc

    def get_stats(self, timeout: Optional[float] = 2) -> List[dict]:
        result = self._executor.iteration_result
        if result is None:
            return []
        result.set_timeout(timeout)
        return result.get_results()

    def get_stats_async(self, timeout: Optional[float] = 2):
        result = self._executor.iteration_result
        if result is None:
            print("Iteration statistics are not available yet. To collect runtime statistics, please call "
                  "get_stats_async() after prompts have been submitted.")
            return _empty_async_gen()
        result.set_timeout(timeout)
        return result

    def get_kv_cache_events(self, timeout: Optional[float] = 2) -> List[dict]:
        return []

    def get_kv_cache_events_async(self, timeout: Optional[float] = 2):
        return _empty_async_gen()

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
        self._workspace.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        self.shutdown()
        return False

    def __getstate__(self):
        raise RuntimeError("LLM object can not be pickled.")


async def _empty_async_gen():
    return
    yield  # pragma: no cover


class _TrtLLM(BaseLLM):
    """LLM class for TensorRT engines (`from tensorrt_llm._tensorrt_engine import LLM`)."""

    def save(self, engine_dir: str) -> None:
        if self._engine_dir is None:
            raise RuntimeError("The engine is not built yet.")
        target = Path(engine_dir)
        if target.resolve() == self._engine_dir.resolve():
            return
        target.mkdir(parents=True, exist_ok=True)
        for item in self._engine_dir.iterdir():
            if item.is_file():
                shutil.copy2(item, target / item.name)


class _TorchLLM:
    """The PyTorch backend (`tensorrt_llm.LLM`). It cannot load TensorRT engine directories."""

    def __init__(self, model, *args, backend: str = "pytorch", **kwargs) -> None:
        if _is_engine_dir(Path(model)):
            raise AssertionError("PyTorch backend does not support engine directories; "
                                 "Please use 'from tensorrt_llm._tensorrt_engine import LLM' instead")
        trt_only = {"build_config", "workspace", "enable_build_cache", "fast_build", "batching_type",
                    "extended_runtime_perf_knob_config", "normalize_log_probs"}
        for key in kwargs:
            if key in trt_only:
                raise ValueError(f"{key} is not supported by the PyTorch backend. Please use "
                                 "'from tensorrt_llm._tensorrt_engine import LLM' instead")
        raise NotImplementedError("the tensorrt_llm test double has no PyTorch backend")


LLM = _TorchLLM

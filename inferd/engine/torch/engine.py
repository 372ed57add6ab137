"""TorchEngine: the Llama-family decoder in PyTorch (CUDA or the CPU) behind the shared step engine.

Everything about requests (continuous batching, paged KV blocks, the prefix cache, LoRA adapters,
grammars, fair slots) is StepEngine's, the same code the reference engine runs; the runner
(inferd.engine.torch.runner) holds the weights, the KV pool, the decode graphs and the device sampler.
Loading (weights, the KV pool sized from free memory, graph capture) runs on the load thread and the
steps on the step thread: the event loop never waits on the device.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import torch

from inferd.engine.base import EngineError
from inferd.engine.reference.config import LlamaConfig
from inferd.engine.step_engine import StepEngine
from inferd.engine.torch.memory import device_lock
from inferd.engine.torch.model import TorchLlama
from inferd.engine.torch.runner import TorchRunner

LOAD_FORMATS = ("auto", "dummy")
# vLLM's largest captured decode batch by default (its max_cudagraph_capture_size); bigger ones run eagerly
DEFAULT_GRAPH_MAX_BATCH = 512
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _is_device_name(name: str) -> bool:
    try:
        return torch.device(name).type in ("cpu", "cuda") and name.split(":")[0] in ("cpu", "cuda")
    except (RuntimeError, TypeError):
        return False


class TorchDeviceError(EngineError):
    """The configured device cannot be used here (no CUDA, no such GPU). Never falls back to another."""


class TorchEngine(StepEngine):
    """A StepEngine over TorchLlama. `num_kv_blocks` None (CUDA only): the pool takes what
    `gpu_memory_utilization` of the GPU leaves after the weights and a profiling step. `cuda_graphs`:
    decode steps replay graphs captured at load for a ladder of batch sizes up to
    `cuda_graph_max_batch_size` (default min(max_batch_size, 512)); on the CPU the same fixed-size
    buffers run eagerly (what the tests exercise). `load_format` "dummy": random weights from the
    artifact's config.json (for benchmarks; vLLM's name)."""

    backend = "torch"

    def __init__(self, artifact_dir: Path, *, num_kv_blocks: int | None = None, device: str = "cuda",
                 dtype: str = "bfloat16", gpu_memory_utilization: float = 0.9, cuda_graphs: bool = True,
                 cuda_graph_max_batch_size: int | None = None, load_format: str = "auto", seed: int = 0,
                 **options) -> None:
        if not _is_device_name(device):
            raise ValueError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {device!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if num_kv_blocks is None and device == "cpu":
            raise ValueError("num_kv_blocks is required on the CPU (only a GPU's free memory sizes the pool)")
        graph_max = cuda_graph_max_batch_size
        if graph_max is not None and graph_max < 1:
            raise ValueError(f"cuda_graph_max_batch_size must be >= 1, got {graph_max}")
        super().__init__(artifact_dir, num_kv_blocks=num_kv_blocks, **options)
        self._device, self._dtype = device, dtype
        self.compute_precision = dtype           # EngineInfo.precision
        self._num_kv_blocks_asked = num_kv_blocks
        self._utilization = gpu_memory_utilization
        self._graphs, self._graph_max = cuda_graphs, graph_max
        self._load_format, self._seed = load_format, seed

    @property
    def hardware(self) -> str:
        """The GPU's name as a label ("nvidia-h100-80gb-hbm3"), or "cpu"."""
        device = torch.device(self._device)
        if device.type != "cuda":
            return "cpu"
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")[:64] or "gpu"

    def _make_runner(self) -> TorchRunner:
        device = self._open_device()
        dtype = DTYPES[self._dtype]
        if self._load_format == "dummy":
            config = LlamaConfig.from_json(self.artifact_dir / "config.json")
            model = TorchLlama.dummy(config, device=device, dtype=dtype, seed=self._seed)
        else:
            model = TorchLlama.from_pretrained(self.artifact_dir, device=device, dtype=dtype)
        runner = TorchRunner(model)
        lock = device_lock(device) if device.type == "cuda" else contextlib.nullcontext()
        try:
            with lock:       # one load at a time per GPU: its profile reads device-wide counters
                graph_max = min(self._graph_max or DEFAULT_GRAPH_MAX_BATCH, self._max_batch_size) if self._graphs else 0
                self._num_kv_blocks = runner.allocate(
                    self._num_kv_blocks, self._block_size, gpu_memory_utilization=self._utilization,
                    max_num_tokens=self._max_num_tokens, max_batch_size=self._max_batch_size,
                    max_model_len=self._context_limit(model.config, None), graph_max_batch=graph_max)
                self._attach_drafter(runner, device, dtype)
                runner.compile_kernels()
                if graph_max:
                    runner.capture(graph_max, self._context_limit(model.config, self._num_kv_blocks), self._block_size)
        except BaseException:
            runner.release()
            raise
        return runner

    def _attach_drafter(self, runner: TorchRunner, device: torch.device, dtype: torch.dtype) -> None:
        """A draft model (speculative method "draft_model"), its KV pool as many blocks as the target's."""
        spec = self._speculation
        if spec is None or spec.draft_dir is None:
            return
        if device.type == "cuda" and self._num_kv_blocks_asked is None:
            # the pool was sized from what the GPU had left: a second pool now could run it out of memory
            raise ValueError("a draft model on CUDA needs num_kv_blocks set (the draft's KV pool has as many "
                             "blocks as the target's, and is not in gpu_memory_utilization's sizing)")
        from inferd.engine.speculative.draft_model import DraftModel
        from inferd.engine.torch.draft import TorchDraft

        runner.drafter = DraftModel(TorchDraft.load(Path(spec.draft_dir), self.artifact_dir, runner.config.vocab_size,
                                                    self._num_kv_blocks, self._block_size, device=device, dtype=dtype))

    def _open_device(self) -> torch.device:
        device = torch.device(self._device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise TorchDeviceError(f"device {self._device!r}: this machine has no usable CUDA device "
                                       f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
            index = device.index or 0
            if index >= torch.cuda.device_count():
                raise TorchDeviceError(f"device {self._device!r}: only {torch.cuda.device_count()} CUDA device(s)")
            device = torch.device("cuda", index)
            torch.cuda.set_device(device)
        return device

    async def close(self) -> None:
        await super().close()
        runner = getattr(self, "_runner", None)
        if runner is not None:      # emptying the allocator's cache waits for the device: off the loop
            await asyncio.to_thread(runner.release)

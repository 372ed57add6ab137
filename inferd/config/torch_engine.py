"""`[models.<name>.torch]`: the PyTorch engine's device, dtype and memory (backend = "torch", docs/gpu.md)."""
from __future__ import annotations

import re
from typing import Literal

from inferd.config.walk import ConfigTable

TorchDtype = Literal["bfloat16", "float16", "float32"]
LoadFormat = Literal["auto", "dummy"]
DEVICE_RE = re.compile(r"^(cpu|cuda(:\d{1,2})?)$")


class TorchConfig(ConfigTable):
    device: str = "cuda"                      # "cuda", "cuda:N" or "cpu"; never falls back to another
    dtype: TorchDtype = "bfloat16"            # weights, activations and the KV pool (logits are float32)
    # CUDA: the share of the GPU's memory this engine may end up holding (weights, activations, CUDA graphs,
    # KV pool), as vLLM's gpu_memory_utilization; the KV pool takes what is left of it after a profiling
    # step. models.X.num_kv_blocks, when set, sizes the pool instead.
    gpu_memory_utilization: float = 0.9
    cuda_graphs: bool = True                  # decode steps replay CUDA graphs captured at start
    cuda_graph_max_batch_size: int | None = None   # the largest batch captured (at most max_batch_size); default
    #                                                 min(max_batch_size, 512), vLLM's largest capture size
    # "auto": the artifact's safetensors; "dummy": random weights made on the device from its config.json
    # (vLLM's load_format "dummy": for benchmarks and capacity checks; the output is noise)
    load_format: LoadFormat = "auto"
    seed: int = 0                             # of the dummy weights


def torch_errors(path: str, backend: str, table: TorchConfig | None) -> list[str]:
    """Problems of one model's [torch] table, each as `path.key: problem`."""
    if table is None:
        return []
    p = f"{path}.torch"
    if backend != "torch":
        return [f"{p}: a [torch] section needs backend = \"torch\" (backend is {backend!r})"]
    errors = []
    if not DEVICE_RE.match(table.device):
        errors.append(f"{p}.device: expected \"cuda\", \"cuda:N\" or \"cpu\", got {table.device!r}")
    if not 0 < table.gpu_memory_utilization <= 1:
        errors.append(f"{p}.gpu_memory_utilization: must be in (0, 1], got {table.gpu_memory_utilization}")
    size = table.cuda_graph_max_batch_size
    if size is not None and size < 1:
        errors.append(f"{p}.cuda_graph_max_batch_size: must be >= 1, got {size}")
    return errors

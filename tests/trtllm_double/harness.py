"""Run TrtllmEngine on the tensorrt_llm test double: sys.path handling and engine directories.

The double is importable only inside `use_double()`, so no other test can pick it up by accident.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

DOUBLE_ROOT = Path(__file__).resolve().parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


@contextlib.contextmanager
def use_double() -> Iterator[object]:
    """Put the double first on sys.path; afterwards remove it and forget its modules."""
    if "tensorrt_llm" in sys.modules and not getattr(sys.modules["tensorrt_llm"], "IS_TEST_DOUBLE", False):
        raise RuntimeError("the real tensorrt_llm is imported; the double cannot replace it")
    sys.path.insert(0, str(DOUBLE_ROOT))
    try:
        from tensorrt_llm._double import controls
        controls.reset()
        yield controls
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(DOUBLE_ROOT))
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[name]


def make_engine_dir(root: Path, tokenizer_dir: Path, *, max_batch_size: int = 4, max_num_tokens: int = 64,
                    max_seq_len: int = 256, max_input_len: int | None = None, tokens_per_block: int = 16,
                    lora: bool = False, copy_tokenizer: bool = True, vocab_size: int | None = None) -> Path:
    """A TensorRT-LLM engine directory as the double reads it: config.json + rank0.engine (+ tokenizer)."""
    root.mkdir(parents=True, exist_ok=True)
    if vocab_size is None:       # a real engine's config records the model's vocabulary
        from tokenizers import Tokenizer
        vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    config = {
        "version": "1.2.1",
        "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float16", "vocab_size": vocab_size,
                              "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}},
        "build_config": {"max_input_len": max_input_len or max_seq_len, "max_seq_len": max_seq_len,
                         "max_batch_size": max_batch_size, "max_beam_width": 1, "max_num_tokens": max_num_tokens,
                         "plugin_config": {"tokens_per_block": tokens_per_block, "use_paged_context_fmha": True,
                                           "lora_plugin": "auto" if lora else None}},
    }
    (root / "config.json").write_text(json.dumps(config, indent=2))
    (root / "rank0.engine").write_bytes(b"double-engine")
    if copy_tokenizer:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy2(tokenizer_dir / name, root / name)
    return root


def make_lora_dir(path: Path, *, rank: int = 2) -> Path:
    """An HF/PEFT LoRA directory (adapter_config.json + adapter_model.safetensors), what a `LoRARequest`
    with lora_ckpt_source "hf" names; the double never reads the weights, so two small tensors do."""
    import numpy as np

    from inferd.artifacts.build.lora import write_peft_adapter

    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {f"{prefix}.lora_A.weight": np.zeros((rank, 8), np.float32),
               f"{prefix}.lora_B.weight": np.zeros((8, rank), np.float32)}
    return write_peft_adapter(path, tensors, rank=rank, alpha=2.0 * rank, targets=("q_proj",))


# Small limits, like the sim entry: queueing and capacity effects show with a handful of requests.
# The engine directory is bare (no manifest): verification has its own tests.
CONFORMANCE_KWARGS = dict(max_batch_size=4, max_num_tokens=64, kv_cache_max_tokens=48 * 16, verify=False)


@contextlib.asynccontextmanager
async def trtllm_on_double(source_dir: Path, tmp_path: Path, *, engine_dir_kwargs: dict | None = None,
                           step_time_s: float = 0.002, **engine_kwargs) -> AsyncIterator[object]:
    """A started, warmed TrtllmEngine over the double, closed afterwards (tokenizer files from `source_dir`).

    Iterations take `step_time_s` (a GPU's take ~10-30 ms), so streams interleave with their readers.
    """
    from inferd.engine.trtllm.engine import TrtllmEngine

    with use_double() as controls:
        controls.step_time_s = step_time_s
        engine_dir = make_engine_dir(tmp_path / "trtllm-engine", source_dir, **(engine_dir_kwargs or {}))
        engine = TrtllmEngine(engine_dir, **{**CONFORMANCE_KWARGS, **engine_kwargs})
        await engine.start()
        try:
            await engine.warmup()
            yield engine
        finally:
            await engine.close()

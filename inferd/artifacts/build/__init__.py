"""Engine builders: turn a checkpoint (synthetic or Hugging Face) into a verified artifact.

`reference` writes HF-layout Llama checkpoints for the NumPy engine; `trtllm` (when present)
compiles TensorRT-LLM engines. Both publish through `inferd.artifacts.publish_artifact`.
"""
from __future__ import annotations

from inferd.artifacts.build.reference import SYNTHETIC_SPECS, build_synthetic, pack_hf

__all__ = ["SYNTHETIC_SPECS", "build_synthetic", "pack_hf"]

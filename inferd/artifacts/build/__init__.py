"""Engine builders: turn a checkpoint (synthetic or Hugging Face) into a verified artifact.

`reference` writes HF-layout Llama checkpoints for the NumPy engine; `trtllm` (when present)
compiles TensorRT-LLM engines. Both publish through `inferd.artifacts.publish_artifact`.
"""
from __future__ import annotations

from inferd.artifacts.build.reference import (
    INT8_QUANT_METHOD,
    SYNTHETIC_SPECS,
    architecture_from_config,
    build_synthetic,
    pack_hf,
    read_json_object,
    sampling_from_generation_config,
)
from inferd.artifacts.build.trtllm_options import TrtllmOptionError, eagle_config

__all__ = ["INT8_QUANT_METHOD", "SYNTHETIC_SPECS", "TrtllmOptionError", "architecture_from_config", "build_synthetic",
           "eagle_config", "pack_hf", "read_json_object", "sampling_from_generation_config"]

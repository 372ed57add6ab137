"""Mirrors the quantization and speculative-decoding configs the LLM API takes (test double).

Sources: QuantConfig / QuantAlgo / CalibConfig as `examples/llm-api/_tensorrt_engine/llm_quantization.py@726ed456`
imports and passes them (`from tensorrt_llm.llmapi import CalibConfig, QuantAlgo, QuantConfig`,
`LLM(model, quant_config=..., calib_config=...)`); QuantAlgo names as `benchmarks/python/build.py@05316d33`
`get_quant_config` uses them. EagleDecodingConfig as `examples/llm-api/_tensorrt_engine/llm_eagle_decoding.py@8dc6ec91`
builds it (`speculative_model_dir`, `max_draft_len`), and `llmapi/llm_args.py@fcd3f316`: max_draft_len must be
> 0 for Eagle; NGram and Draft_Target speculation support the pytorch backend only (`supports_backend`), so
the TensorRT backend refuses them ("Speculation type ... does not support backend tensorrt").
"""
from __future__ import annotations

import enum
from typing import List, Optional

from .llm_args import StrictBaseModel


class QuantAlgo(str, enum.Enum):
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W4A16_AWQ = "W4A16_AWQ"
    W4A8_AWQ = "W4A8_AWQ"
    W4A16_GPTQ = "W4A16_GPTQ"
    W8A8_SQ_PER_CHANNEL = "W8A8_SQ_PER_CHANNEL"
    W8A8_SQ_PER_TENSOR_PLUGIN = "W8A8_SQ_PER_TENSOR_PLUGIN"
    W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN = "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN"
    FP8 = "FP8"
    INT8 = "INT8"
    NVFP4 = "NVFP4"


class QuantConfig(StrictBaseModel):
    quant_algo: Optional[QuantAlgo] = None
    kv_cache_quant_algo: Optional[QuantAlgo] = None
    group_size: int = 128


class CalibConfig(StrictBaseModel):
    device: str = "cuda"
    calib_dataset: str = "cnn_dailymail"
    calib_batches: int = 512
    calib_batch_size: int = 1
    calib_max_seq_length: int = 512
    random_seed: int = 1234
    tokenizer_max_seq_length: int = 2048


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    speculative_model_dir: Optional[str] = None
    decoding_type: str = ""

    def supports_backend(self, backend: str) -> bool:
        return True


class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: str = "Eagle"
    eagle_choices: Optional[List[List[int]]] = None
    greedy_sampling: Optional[bool] = True
    num_eagle_layers: Optional[int] = None
    max_non_leaves_per_layer: Optional[int] = None

    def model_post_init(self, context) -> None:
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for Eagle")
        if self.speculative_model_dir is None:
            raise ValueError("Draft model must be provided for EAGLE")


class NGramDecodingConfig(DecodingBaseConfig):
    decoding_type: str = "NGram"
    max_matching_ngram_size: int = 2

    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: str = "Draft_Target"

    def supports_backend(self, backend: str) -> bool:
        return backend in ("pytorch", "_autodeploy")


def validate_quant_and_speculation(kwargs: dict) -> None:
    """TrtLlmArgs' checks of these fields (the TensorRT backend: backend None means "tensorrt")."""
    for key, cls in (("quant_config", QuantConfig), ("calib_config", CalibConfig),
                     ("speculative_config", DecodingBaseConfig)):
        value = kwargs.get(key)
        if value is not None and not isinstance(value, cls):
            raise ValueError(f"{key} must be a {cls.__name__}, got {type(value).__name__}")
    spec = kwargs.get("speculative_config")
    if spec is not None and not spec.supports_backend(kwargs.get("backend") or "tensorrt"):
        raise ValueError(f"Speculation type {spec.decoding_type} does not support backend "
                         f"{kwargs.get('backend') or 'tensorrt'}")

"""Mirrors the quantization and speculative-decoding configs the LLM API takes (test double).

Sources: QuantConfig / QuantAlgo / CalibConfig as `examples/llm-api/_tensorrt_engine/llm_quantization.py@726ed456`
imports and passes them (`from tensorrt_llm.llmapi import CalibConfig, QuantAlgo, QuantConfig`,
`LLM(model, quant_config=..., calib_config=...)`); QuantAlgo names as `benchmarks/python/build.py@05316d33`
`get_quant_config` uses them. EagleDecodingConfig as `examples/llm-api/_tensorrt_engine/llm_eagle_decoding.py@8dc6ec91`
builds it (`speculative_model_dir`, `max_draft_len`), and `llmapi/llm_args.py@fcd3f316`: max_draft_len must be
> 0 for Eagle; NGram and Draft_Target speculation support the pytorch backend only (`supports_backend`), so
the TensorRT backend refuses them ("Speculation type ... does not support backend tensorrt").
The build's quantization step as `llmapi/llm_utils.py@7b437aaa` `ModelLoader._load_model_from_hf` takes it: a
checkpoint whose config.json has a `quantization_config` is pre-quantized (`_update_from_hf_quant_config`: FP8
block scales and MXFP4 are known, anything else raises NotImplementedError "Unsupported quantization_config");
otherwise `quant_config._requires_calibration` (models/modeling_utils.py QuantConfig: every algorithm but W8A16,
W4A16 and FP8_PER_CHANNEL_PER_TOKEN, or a quantized KV cache) runs ModelOpt's quantize with
`**calib_config.to_dict()`, recorded here as a "quantize" call; W8A16 is quantized while converting, uncalibrated.
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import List, Optional

from .._double.controls import controls

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
    FP8_PER_CHANNEL_PER_TOKEN = "FP8_PER_CHANNEL_PER_TOKEN"
    FP8_BLOCK_SCALES = "FP8_BLOCK_SCALES"
    INT8 = "INT8"
    NVFP4 = "NVFP4"


# quantization/mode.py: every algorithm but INT8 (a KV-cache one); the KV cache's algorithms
QUANT_ALGO_LIST = [a for a in QuantAlgo if a is not QuantAlgo.INT8]
KV_CACHE_QUANT_ALGO_LIST = [QuantAlgo.FP8, QuantAlgo.INT8, QuantAlgo.NVFP4]


class QuantConfig(StrictBaseModel):
    quant_algo: Optional[QuantAlgo] = None
    kv_cache_quant_algo: Optional[QuantAlgo] = None
    group_size: int = 128

    @property
    def _requires_calibration(self) -> bool:
        return self.quant_algo in (set(QUANT_ALGO_LIST) - {
            QuantAlgo.W8A16, QuantAlgo.W4A16, QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN}) \
            or self.kv_cache_quant_algo in KV_CACHE_QUANT_ALGO_LIST


class CalibConfig(StrictBaseModel):
    device: str = "cuda"
    calib_dataset: str = "cnn_dailymail"
    calib_batches: int = 512
    calib_batch_size: int = 1
    calib_max_seq_length: int = 512
    random_seed: int = 1234
    tokenizer_max_seq_length: int = 2048

    def to_dict(self) -> dict:
        return self.model_dump()


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


def quantize_on_build(hf_dir: Path, hf_config: dict, kwargs: dict) -> None:
    """The build's quantization step: refuse a pre-quantized checkpoint TensorRT-LLM cannot read, and record
    the calibration a calibrated algorithm runs."""
    if not (hf_dir / "hf_quant_config.json").is_file() and hf_config.get("quantization_config") is not None:
        q = hf_config["quantization_config"]
        if not ((q.get("quant_method") == "fp8" and q.get("weight_block_size")) or q.get("quant_method") == "mxfp4"):
            raise NotImplementedError(f"Unsupported quantization_config: {q}.")
        return                                            # pre-quantized: no calibration
    quant = kwargs.get("quant_config") or QuantConfig()
    if quant._requires_calibration:
        calib = kwargs.get("calib_config") or CalibConfig()
        controls.calls.append(("quantize", dict(model_dir=str(hf_dir), quant_config=quant, **calib.to_dict())))

"""TensorRT-LLM's quantization and speculative-decoding arguments, as its LLM API takes them (docs/trtllm-api.md §7).

- Quantization (`--quantize`): `quant_config=QuantConfig(quant_algo=..., kv_cache_quant_algo=...)` and an optional
  `calib_config=CalibConfig(calib_dataset=...)`, imported from `tensorrt_llm.llmapi`, passed to the building
  `LLM(...)` (examples/llm-api/_tensorrt_engine/llm_quantization.py@726ed456: FP8 weights and KV with a
  CalibConfig; W4A16_AWQ with None, its default calibration). SmoothQuant is `QuantAlgo.W8A8_SQ_PER_CHANNEL`
  (benchmarks/python/build.py@05316d33 `get_quant_config`), int8 weight-only `QuantAlgo.W8A16` (the same).
  Only a calibrated algorithm uses the CalibConfig: llmapi/llm_utils.py@7b437aaa runs ModelOpt's quantize with
  `**calib_config.to_dict()` when `quant_config._requires_calibration`, which models/modeling_utils.py's QuantConfig
  says is false for W8A16 (its weights are quantized while converting), so --calib-dataset is refused with int8.
- Speculation: EAGLE, the one drafter of the three (draft-target, n-gram, EAGLE) the TensorRT backend runs:
  llmapi/llm_args.py@fcd3f316 has NGramDecodingConfig and DraftTargetDecodingConfig support only the PyTorch
  backend (`supports_backend`), which inferd does not drive. `speculative_config=EagleDecodingConfig(
  speculative_model_dir=..., max_draft_len=...)` (examples/llm-api/_tensorrt_engine/llm_eagle_decoding.py@8dc6ec91;
  the field is `speculative_model` in later trees, so both names are tried); its validator sets the build's
  speculative_decoding_mode to EAGLE and max_draft_len.
Imported only when asked for: a plain build needs none of these names.
"""
from __future__ import annotations

from pathlib import Path

# --quantize -> (QuantAlgo of the weights, QuantAlgo of the KV cache or None, the manifest's precision)
QUANTIZATIONS = {
    "fp8": ("FP8", "FP8", "fp8"),
    "int8_sq": ("W8A8_SQ_PER_CHANNEL", None, "int8_sq"),
    "int4_awq": ("W4A16_AWQ", None, "int4_awq"),
    "int8": ("W8A16", None, "int8"),
}


# The --quantize values TensorRT-LLM calibrates (QuantConfig._requires_calibration); int8 (W8A16) it does not.
CALIBRATED = ("fp8", "int8_sq", "int4_awq")


class TrtllmOptionError(ValueError):
    """A quantization or speculation option this TensorRT-LLM cannot take."""


def quantization_kwargs(quantize: str | None, calib_dataset: str | None) -> tuple[dict, dict]:
    """LLM(...) keyword arguments for `quantize`, and the manifest's record of them."""
    if quantize is None:
        if calib_dataset is not None:
            raise TrtllmOptionError("--calib-dataset goes with --quantize fp8, int8_sq or int4_awq")
        return {}, {}
    if quantize not in QUANTIZATIONS:
        raise TrtllmOptionError(f"--quantize {quantize}: the trtllm target builds {', '.join(QUANTIZATIONS)}")
    if calib_dataset is not None and quantize not in CALIBRATED:
        raise TrtllmOptionError(f"--calib-dataset: TensorRT-LLM does not calibrate --quantize {quantize} (its weights "
                                f"are quantized as they are converted); it goes with {', '.join(CALIBRATED)}")
    from tensorrt_llm.llmapi import CalibConfig, QuantAlgo, QuantConfig

    weights, kv, precision = QUANTIZATIONS[quantize]
    config = QuantConfig(quant_algo=getattr(QuantAlgo, weights),
                         **({"kv_cache_quant_algo": getattr(QuantAlgo, kv)} if kv else {}))
    kwargs = {"quant_config": config}
    if calib_dataset is not None:
        kwargs["calib_config"] = CalibConfig(calib_dataset=calib_dataset)
    recorded = {"precision": precision, "quant_algo": weights}
    if kv:
        recorded["kv_cache_quant_algo"] = kv
    return kwargs, recorded


def eagle_config(eagle_dir: Path | str, max_draft_len: int):
    """EagleDecodingConfig for an EAGLE head at `eagle_dir` (the field's name differs between releases)."""
    from tensorrt_llm.llmapi import EagleDecodingConfig

    if max_draft_len < 1:
        raise TrtllmOptionError(f"max_draft_len must be >= 1, got {max_draft_len}")
    fields = getattr(EagleDecodingConfig, "model_fields", {})
    name = "speculative_model_dir" if "speculative_model_dir" in fields or not fields else "speculative_model"
    return EagleDecodingConfig(max_draft_len=max_draft_len, **{name: str(eagle_dir)})


def speculation_kwargs(eagle_dir: Path | None, max_draft_len: int) -> tuple[dict, dict]:
    if eagle_dir is None:
        return {}, {}
    if not Path(eagle_dir).is_dir():
        raise TrtllmOptionError(f"--eagle-dir {eagle_dir}: not a directory")
    return ({"speculative_config": eagle_config(eagle_dir, max_draft_len)},
            {"speculative": "eagle", "max_draft_len": max_draft_len})

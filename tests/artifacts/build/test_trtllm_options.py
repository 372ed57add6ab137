"""Quantized TensorRT-LLM builds on the tensorrt_llm test double: the QuantConfig and CalibConfig reach the LLM API,
TensorRT-LLM calibrates what it calibrates, the manifest records the precision, and sources it cannot take are
refused before anything starts."""
from __future__ import annotations

import asyncio

import pytest

from inferd.artifacts.manifest import verify_artifact
from inferd.engine.trtllm.engine import TrtllmEngine
from tests.engine.trtllm.test_engine import build_args, calls
from tests.trtllm_double.harness import use_double


@pytest.mark.parametrize("quantize, algo, kv_algo", [("fp8", "FP8", "FP8"), ("int8_sq", "W8A8_SQ_PER_CHANNEL", None),
                                                     ("int4_awq", "W4A16_AWQ", None)])
async def test_a_calibrated_build_passes_its_quant_and_calib_configs_and_the_manifest_records_its_precision(
        tiny_artifact, tmp_path, quantize, algo, kv_algo) -> None:
    from inferd.artifacts.build import trtllm as builder

    with use_double() as controls:
        path = await asyncio.to_thread(builder.build, build_args(tiny_artifact, tmp_path / "engines", max_seq_len=256,
                                                                 quantize=quantize, calib_dataset="/data/calib"))
        (llm_call,) = calls(controls, "LLM")
        quant, calib = llm_call["quant_config"], llm_call["calib_config"]
        assert quant.quant_algo.value == algo and (quant.kv_cache_quant_algo.value if quant.kv_cache_quant_algo
                                                   else None) == kv_algo
        assert calib.calib_dataset == "/data/calib"
        (calibration,) = calls(controls, "quantize")             # the double's record of ModelOpt's calibration
        assert calibration["calib_dataset"] == "/data/calib"
        manifest = verify_artifact(path)
        assert manifest.build["precision"] == quantize and manifest.build["quant_algo"] == algo
        engine = TrtllmEngine(path, kv_cache_max_tokens=1024)
        await engine.start()
        try:
            assert engine.info.precision == quantize
        finally:
            await engine.close()


async def test_an_int8_weight_only_build_is_w8a16_converted_without_calibration(tiny_artifact, tmp_path) -> None:
    from inferd.artifacts.build import trtllm as builder

    with use_double() as controls:
        path = await asyncio.to_thread(builder.build, build_args(tiny_artifact, tmp_path / "engines", max_seq_len=256,
                                                                 quantize="int8"))
        (llm_call,) = calls(controls, "LLM")
        assert llm_call["quant_config"].quant_algo.value == "W8A16" and "calib_config" not in llm_call
        assert calls(controls, "quantize") == []
        assert verify_artifact(path).build["precision"] == "int8"


@pytest.mark.parametrize("quantize, message", [(None, "--calib-dataset goes with --quantize"),
                                               ("int8", "does not calibrate --quantize int8")])
def test_a_calibration_dataset_that_would_be_ignored_is_a_bad_argument(tiny_artifact, tmp_path, capsys, quantize,
                                                                       message) -> None:
    from inferd.artifacts.build import trtllm as builder

    with use_double() as controls:
        assert builder.main(build_args(tiny_artifact, tmp_path / "engines", quantize=quantize, calib_dataset="x")) == 2
        assert calls(controls, "LLM") == []
    assert message in capsys.readouterr().err


def test_an_inferd_int8_version_is_refused_as_a_source_before_tensorrt_llm_starts(int8_artifact, tmp_path,
                                                                                   capsys) -> None:
    from inferd.artifacts.build import trtllm as builder

    with use_double() as controls:
        assert builder.main(build_args(int8_artifact, tmp_path / "engines", quantize="int8")) == 2
        assert calls(controls, "LLM") == []
    assert "an inferd int8 version" in capsys.readouterr().err


def test_the_double_refuses_a_pre_quantized_checkpoint_it_does_not_know_as_tensorrt_llm_does(int8_artifact) -> None:
    with use_double():
        from tensorrt_llm._tensorrt_engine import LLM

        with pytest.raises(NotImplementedError, match="Unsupported quantization_config"):
            LLM(model=str(int8_artifact))

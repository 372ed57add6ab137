"""The penalties, min_p and logit_bias on the trtllm backend, against the tensorrt_llm test double: what maps
onto SamplingParams, and a 400 (InvalidRequest naming the parameter) for what TensorRT-LLM cannot do."""
from __future__ import annotations

import asyncio

import pytest

from inferd.engine.base import InvalidRequest
from inferd.types import GenerationRequest, SamplingParams
from tests.trtllm_double.harness import trtllm_on_double

TIMEOUT_S = 20.0


def request(engine, rid: str, **sampling) -> GenerationRequest:
    sampling.setdefault("ignore_eos", True)
    sampling.setdefault("max_tokens", 4)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode("a b c d")),
                             sampling=SamplingParams(**sampling))


async def run(engine, req):
    return await asyncio.wait_for(engine.submit(req).collect(), TIMEOUT_S)


def last_sampling_params(controls):
    return [kw for method, kw in controls.calls if method == "generate_async"][-1]["sampling_params"]


async def test_defaults_pass_none_of_them(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        await run(engine, request(engine, "d", temperature=0.7))
        sp = last_sampling_params(controls)
        assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty, sp.min_p, sp.embedding_bias) == (
            None, None, None, None, None)


async def test_repetition_penalty_and_min_p_at_temperature_1_map_onto_sampling_params(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        await run(engine, request(engine, "r", temperature=1.0, repetition_penalty=1.3, min_p=0.1, top_k=20))
        sp = last_sampling_params(controls)
        assert (sp.repetition_penalty, sp.min_p, sp.top_k, sp.temperature) == (1.3, 0.1, 20, 1.0)
        # greedy: min_p cannot change the argmax (vLLM's rule too), so it is not sent
        await run(engine, request(engine, "g", temperature=0.0, min_p=0.5, repetition_penalty=0.8))
        sp = last_sampling_params(controls)
        assert (sp.top_k, sp.min_p, sp.repetition_penalty) == (1, None, 0.8)


async def test_logit_bias_becomes_a_float32_embedding_bias_over_the_engines_vocabulary(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        final = await run(engine, request(engine, "b", temperature=0.0, logit_bias=((65, 100.0), (3, -100.0))))
        bias = last_sampling_params(controls).embedding_bias
        assert str(bias.dtype) == "torch.float32" and tuple(bias.shape) == (engine._embedding_vocab,)
        assert (float(bias[65]), float(bias[3]), float(bias.abs().sum())) == (100.0, -100.0, 200.0)
        assert final.token_ids == [65] * 4          # the double's flat logits: the bias decides


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
async def test_presence_and_frequency_penalties_are_refused_naming_them(tiny_artifact, tmp_path, field) -> None:
    # TensorRT-LLM counts prompt tokens in them, after temperature (penaltyKernels.cu): not vLLM's meaning
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        with pytest.raises(InvalidRequest) as info:
            engine.submit(request(engine, "p", temperature=0.7, **{field: 0.5}))
        assert info.value.param == field and "trtllm" in str(info.value)
        await run(engine, request(engine, "zero", temperature=0.7, **{field: 0.0}))   # the no-op is fine


async def test_min_p_with_another_temperature_is_refused_naming_it(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        with pytest.raises(InvalidRequest) as info:
            engine.submit(request(engine, "m", temperature=0.7, min_p=0.1))
        assert info.value.param == "min_p"


async def test_a_logit_bias_id_outside_the_vocabulary_is_refused_before_the_executor(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        with pytest.raises(InvalidRequest) as info:
            engine.submit(request(engine, "v", logit_bias=((engine._vocab_size, 1.0),)))
        assert info.value.param == "logit_bias"

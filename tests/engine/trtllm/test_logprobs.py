"""logprobs on the TensorRT-LLM backend, against the test double: mapped onto SamplingParams.logprobs and read
back from CompletionOutput.logprobs; what the backend cannot answer is InvalidRequest naming the parameter."""
from __future__ import annotations

import asyncio

import pytest

from inferd.engine.base import InvalidRequest
from inferd.types import GenerationRequest, SamplingParams
from tests.trtllm_double.harness import trtllm_on_double

PROMPT = "Paged attention keeps the KV cache in blocks of tokens"


def request(engine, rid: str, **sampling) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(PROMPT)),
                             sampling=SamplingParams(ignore_eos=True, max_tokens=6, temperature=0.0, **sampling))


@pytest.mark.parametrize("k", [0, 3])
async def test_each_token_gets_its_logprob_and_top_k_from_completion_output(tiny_artifact, tmp_path, k):
    async with trtllm_on_double(tiny_artifact, tmp_path, gather_generation_logits=True) as engine:
        from tensorrt_llm._double import controls

        out = await asyncio.wait_for(engine.submit(request(engine, "lp", logprobs=k)).collect(), 20)
        sent = [c["sampling_params"] for m, c in controls.calls if m == "generate_async"][-1]
        assert sent.logprobs == max(1, k)            # TensorRT-LLM returns none for 0
        assert [e.token_id for e in out.logprobs] == out.token_ids
        for e in out.logprobs:
            assert e.logprob < 0 and len(e.top) == k
            assert [v for _, v in e.top] == sorted((v for _, v in e.top), reverse=True)
        plain = await asyncio.wait_for(engine.submit(request(engine, "plain")).collect(), 20)
        assert plain.logprobs is None and plain.token_ids == out.token_ids


async def test_without_gathered_logits_logprobs_are_refused_naming_the_parameter(tiny_artifact, tmp_path):
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        with pytest.raises(InvalidRequest) as err:
            engine.submit(request(engine, "lp", logprobs=1))
        assert err.value.param == "logprobs"


async def test_echo_with_logprobs_is_refused_naming_echo(tiny_artifact, tmp_path):
    async with trtllm_on_double(tiny_artifact, tmp_path, gather_generation_logits=True) as engine:
        with pytest.raises(InvalidRequest) as err:
            engine.submit(request(engine, "echo", logprobs=1, prompt_logprobs=1))
        assert err.value.param == "echo"

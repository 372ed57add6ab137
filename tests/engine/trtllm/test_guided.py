"""Structured output on the trtllm backend (inferd.engine.trtllm.guided), against the tensorrt_llm test double:
GuidedDecoding as GuidedDecodingParams, the LLM built with xgrammar, and grammars vetted before they are sent."""
from __future__ import annotations

import asyncio
import json

import pytest

from inferd.engine.base import InvalidRequest
from inferd.engine.grammar import choice_regex
from inferd.types import FinishReason, GenerationRequest, GuidedDecoding, SamplingParams
from tests.trtllm_double.harness import trtllm_on_double

TIMEOUT_S = 20.0
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "c": {"enum": ["red", "green"]}},
          "required": ["ok", "c"], "additionalProperties": False}
JSON_SCHEMA = GuidedDecoding(kind="json_schema", spec=json.dumps(SCHEMA, separators=(",", ":"), sort_keys=True))
CHOICE = GuidedDecoding(kind="choice", spec='["alpha","beta (b)","gamma|g"]')


def request(engine, rid: str, guided: GuidedDecoding | None, **sampling) -> GenerationRequest:
    sampling.setdefault("max_tokens", 200)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode("a b c d")),
                             sampling=SamplingParams(guided=guided, **sampling))


async def run(engine, req):
    if req.sampling.guided is not None:      # the API's grammar stage, off the loop
        await asyncio.to_thread(engine.grammars.compile, req.sampling.guided)
    return await asyncio.wait_for(engine.submit(req).collect(), TIMEOUT_S)


def last_sampling_params(controls):
    return [kw for method, kw in controls.calls if method == "generate_async"][-1]["sampling_params"]


async def test_the_llm_is_built_with_xgrammar_guided_decoding(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        (llm_kwargs,) = [kw for method, kw in controls.calls if method == "LLM"]
        assert llm_kwargs["guided_decoding_backend"] == "xgrammar"
        assert engine.grammars is not None and engine.grammars.vocab_size == engine._embedding_vocab


@pytest.mark.parametrize(("guided", "expected"), [
    (JSON_SCHEMA, dict(json=JSON_SCHEMA.spec)),
    (GuidedDecoding(kind="json_object"), dict(json='{"type":"object"}')),    # an object, as on every backend
    (GuidedDecoding(kind="regex", spec="[a-z]+"), dict(regex="[a-z]+")),
    (CHOICE, dict(regex=choice_regex(CHOICE.spec))),
    (GuidedDecoding(kind="grammar", spec='root ::= "x" | "y"'), dict(grammar='root ::= "x" | "y"')),
])
async def test_each_kind_maps_onto_guided_decoding_params(tiny_artifact, tmp_path, guided, expected) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        await run(engine, request(engine, "k", guided, max_tokens=4, ignore_eos=True))
        sp = last_sampling_params(controls)
        got = {name: getattr(sp.guided_decoding, name) for name in ("json", "regex", "grammar")
               if getattr(sp.guided_decoding, name) is not None}
        assert got == expected and not sp.guided_decoding.json_object
        assert sp.ignore_eos is False          # the grammar's end (the end token) must end the request


async def test_output_follows_a_choice_and_ends_with_stop(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        for seed in range(4):
            final = await run(engine, request(engine, f"c{seed}", CHOICE, temperature=1.0, seed=seed))
            assert final.finish_reason is FinishReason.STOP
            assert final.text in ("alpha", "beta (b)", "gamma|g")


async def test_output_follows_a_json_schema(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        final = await run(engine, request(engine, "j", JSON_SCHEMA, temperature=0.0))
        assert final.finish_reason is FinishReason.STOP
        value = json.loads(final.text)
        assert set(value) == {"ok", "c"} and value["c"] in ("red", "green")


async def test_requests_without_a_grammar_send_none(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        await run(engine, request(engine, "f", None, max_tokens=4, ignore_eos=True))
        sp = last_sampling_params(controls)
        assert sp.guided_decoding is None and sp.ignore_eos is True


async def test_a_grammar_not_vetted_by_our_xgrammar_never_reaches_the_executor(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        unknown = GuidedDecoding(kind="regex", spec="[0-9]+")
        with pytest.raises(InvalidRequest, match="not compiled"):
            engine.submit(request(engine, "u", unknown))
        bad = GuidedDecoding(kind="regex", spec="(")
        with pytest.raises(Exception):
            await asyncio.to_thread(engine.grammars.compile, bad)
        with pytest.raises(InvalidRequest, match="parenthesis"):
            engine.submit(request(engine, "b", bad))
        assert not [kw for method, kw in controls.calls if method == "generate_async"
                    and kw["sampling_params"].guided_decoding is not None]
        assert engine.healthy

"""Structured output under hostile or unusual input, through the real app over the sim engine: every
answer is a 200 whose output follows the grammar, or a 400 naming the field; nothing leaks."""
from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from inferd.engine.reference.engine import ReferenceEngine
from tests.api.conftest import sim_engine

MESSAGES = [{"role": "user", "content": "hi"}]


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


UNICODE_KEY = "naïve ☃ 😀"
UNICODE_SCHEMA = {"type": "object", "additionalProperties": False, "required": [UNICODE_KEY],
                  "properties": {UNICODE_KEY: {"type": "string", "pattern": "^[é-ÿ]{1,3}$"}}}


async def test_a_schema_with_non_ascii_names_and_patterns_yields_that_text_not_replacement_characters(served):
    resp = await served.sdk.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=80,
                                                    response_format=schema_format(UNICODE_SCHEMA))
    content = resp.choices[0].message.content
    assert "\ufffd" not in content, content
    jsonschema.validate(json.loads(content), UNICODE_SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_non_ascii_choice_arrives_whole_streamed_or_not(served, stream):
    choices = ["café", "naïve", "日本語"]
    extra = {"structured_outputs": {"choice": choices}}
    if stream:
        pieces = [c.choices[0].text async for c in await served.sdk.completions.create(
            model="sim", prompt="x", max_tokens=20, stream=True, extra_body=extra) if c.choices]
        text = "".join(pieces)
    else:
        text = (await served.sdk.completions.create(model="sim", prompt="x", max_tokens=20,
                                                    extra_body=extra)).choices[0].text
    assert text in choices, text


@pytest.mark.parametrize(("schema", "named"), [
    ({"not": {}}, "`not`"),
    ({"allOf": [{"type": "integer", "minimum": 5}, {"type": "integer", "maximum": 3}]}, "`allOf`"),
    ({"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False}, "'a'"),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "maxLength": -1}, "`maxLength`"),
])
async def test_a_schema_the_grammar_would_not_enforce_is_a_400_not_output_that_fails_it(served, schema, named):
    async with served.http.post(served.base_url + "/v1/chat/completions", json={
            "model": "sim", "messages": MESSAGES, "max_tokens": 40, "response_format": schema_format(schema)}) as r:
        body = await r.json()
    assert r.status == 400, body
    assert body["error"]["param"] == "response_format.json_schema.schema" and named in body["error"]["message"]
    assert served.engine.stats().steps_total == 0


# A JSON string cannot hold a raw control character, and the mask bans them: after "a" nothing is allowed.
DEAD_END_FORMAT = schema_format({"type": "string", "pattern": "^a\u0001b$"})


@pytest.mark.parametrize("backend", ["sim", "reference"])
async def test_a_grammar_that_dead_ends_is_a_400_for_that_request_alone_and_no_engine_failure(
        serve, tiny_artifact, backend):
    engine = sim_engine() if backend == "sim" else ReferenceEngine(
        tiny_artifact, num_kv_blocks=64, block_size=16, max_batch_size=4, max_num_tokens=64)
    served = await serve({"sim": engine})
    free = await served.free_kv_blocks()
    verdicts: list[bool] = []         # what the version's circuit breaker is told
    breakers = served.state.control.breakers
    record = breakers.record
    breakers.record = lambda key, ok, ttft_s: (verdicts.append(ok), record(key, ok, ttft_s))[1]

    async def chat(**extra):
        async with served.http.post(served.base_url + "/v1/chat/completions", json={
                "model": "sim", "messages": MESSAGES, "max_tokens": 12, **extra}) as r:
            return r.status, await r.json()

    answers = await asyncio.gather(chat(temperature=0), chat(response_format=DEAD_END_FORMAT),
                                   chat(response_format=DEAD_END_FORMAT, temperature=0.7, seed=1))
    assert answers[0][0] == 200, answers[0]               # batched beside it, an ordinary request is untouched
    for status, body in answers[1:]:
        assert status == 400 and body["error"]["code"] == "grammar_dead_end", body
    assert False not in verdicts, verdicts             # the client's grammar failed it, not the engine
    assert await served.free_kv_blocks() == free


@pytest.mark.parametrize("backend", ["sim", "reference"])
async def test_a_client_leaving_a_guided_stream_frees_its_kv_blocks(serve, tiny_artifact, backend):
    engine = sim_engine(time_scale=1.0) if backend == "sim" else ReferenceEngine(
        tiny_artifact, num_kv_blocks=64, block_size=16, max_batch_size=4, max_num_tokens=64)
    served = await serve({"sim": engine})
    free = await served.free_kv_blocks()
    unbounded = schema_format({"type": "array", "items": {"type": "integer"}})
    async with served.http.post(served.base_url + "/v1/chat/completions", json={
            "model": "sim", "messages": MESSAGES, "max_tokens": 400, "n": 2, "stream": True,
            "response_format": unbounded}) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content"' in line:
                break                          # content is flowing: leave mid-generation
    for _ in range(500):             # the server notices at its next write, then frees (bounded: no timing asserted)
        if await served.free_kv_blocks() == free:
            break
        await asyncio.sleep(0.02)
    assert await served.free_kv_blocks() == free
